#!/usr/bin/env bash
# Draws DIR/sweep.png from the DIR/summary.csv that `tripod sweep` writes:
#   left:  measured step time per layout (median, with min..max as an error bar) beside the
#          planner's prediction;
#   right: the measured split of a step (compute, TP communication, pipeline wait, exposed
#          DP communication, optimizer) stacked per layout, with the predicted total as a
#          point.
#
# usage: tools/plot_sweep.sh [DIR] [OUT.png]
#   DIR      the sweep's output directory (default: sweep_out)
#   OUT.png  the image (default: DIR/sweep.png)
# Needs gnuplot (Debian: gnuplot-nox). Columns are found by name in the CSV header.
set -euo pipefail

dir=${1:-sweep_out}
out=${2:-$dir/sweep.png}
csv="$dir/summary.csv"

if ! command -v gnuplot > /dev/null; then
    echo "plot_sweep: gnuplot not found; install gnuplot-nox (tools/setup.sh)" >&2
    exit 1
fi
if [[ ! -f "$csv" ]]; then
    echo "plot_sweep: $csv not found; run tripod sweep first" >&2
    exit 1
fi

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# One row per layout, in milliseconds: label meas min max pred compute tp wait dp optim.
awk -F, '
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
function v(name) { x = $(col[name]); return x == "" ? "NaN" : 1e3 * x }
{
    # no spaces: the temporary file is whitespace-separated
    label = sprintf("TP%s/PP%s/DP%s/mbs%s", $(col["tp"]), $(col["pp"]), $(col["dp"]),
                    $(col["mbs"]))
    if ($(col["zero"]) == "1") label = label "/ZeRO"
    if (("sp" in col) && $(col["sp"]) == "1") label = label "/SP"
    if (("recompute" in col) && $(col["recompute"]) != "none") label = label "/rc-" $(col["recompute"])
    printf "%s %s %s %s %s %s %s %s %s %s\n", label, v("time_per_step_s"),
           v("time_min_s"), v("time_max_s"), v("predicted_time_s"), v("compute_s"),
           v("tp_comm_s"), v("pp_wait_s"), v("dp_comm_s"), v("optimizer_s")
}' "$csv" > "$data"

rows=$(wc -l < "$data")
if [[ "$rows" -eq 0 ]]; then
    echo "plot_sweep: $csv has no successful trial to draw" >&2
    exit 1
fi
title=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                 { print $(col["model"]) " on " $(col["world"]) " ranks"; exit }' "$csv")
# Rowstacked histograms do not autoscale to the stack: take the tallest bar ourselves.
ymax=$(awk '{ s = 0; for (i = 6; i <= 10; i++) if ($i != "NaN") s += $i
              for (i = 2; i <= 5; i++) if ($i != "NaN" && $i > s) s = $i
              if (s > m) m = s } END { print (m > 0 ? 1.15 * m : 1) }' "$data")

# No path or CSV text goes into the script: gnuplot gets them as ARG1..ARG4 of -c, so a
# quote in a folder's name (or in the model column) cannot end a string and run a command.
script=$(mktemp)
trap 'rm -f "$data" "$script"' EXIT
cat >"$script" <<'EOF'
set terminal pngcairo size 1400,560 font ",10"
set output ARG1
set datafile missing "NaN"
set multiplot layout 1,2 title "tripod sweep: ".ARG3
set style data histograms
set style fill solid 0.85 border -1
set boxwidth 0.8
set grid ytics
set xtics rotate by -30 left
set key outside bottom center horizontal
set ylabel "step time (ms)"
set yrange [0:real(ARG4)]

set title "Measured (median, min..max) vs predicted"
set style histogram errorbars gap 2 lw 1
plot ARG2 using 2:3:4:xtic(1) title "measured" lc rgb "#4477aa", \
     "" using 5:5:5 title "predicted" lc rgb "#ee6677"

set title "Measured split of a step"
set style histogram rowstacked
plot ARG2 using 6:xtic(1) title "compute" lc rgb "#4477aa", \
     "" using 7 title "TP comm" lc rgb "#66ccee", \
     "" using 8 title "pipeline wait" lc rgb "#ccbb44", \
     "" using 9 title "DP comm" lc rgb "#ee6677", \
     "" using 10 title "optimizer + rest" lc rgb "#aa3377", \
     "" using 0:5 with points pt 7 ps 1.5 lc rgb "black" title "predicted total"
unset multiplot
EOF
gnuplot -c "$script" "$out" "$data" "$title" "$ymax"
echo "plot_sweep: wrote $out"
