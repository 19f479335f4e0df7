// Shared by the checkpoint tests: fresh directories, whole-file helpers, a single-process
// communicator (for a writer child that runs without MPI), and global-tensor reads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/checkpoint/checkpoint.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace ckt {

inline std::string fresh_dir(const std::string &path) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) fprintf(stderr, "could not clean %s: %s\n", path.c_str(), ec.message().c_str());
    return path;
}

using tiny::slurp;

inline void spit(const std::string &path, const std::string &data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << data;
}

inline bool exists(const std::string &path) {
    return std::ifstream(path).good();
}

// Every kind of every global tensor of a checkpoint (empty vectors for absent kinds).
struct Globals {
    std::vector<float> t[TPD_P_COUNT][TPD_CKPT_KIND_COUNT];
    int iteration = -1;
};

inline Globals read_globals(const std::string &path) {
    Globals g;
    tpd_ckpt_info info;
    if (tpd_ckpt_open(path.c_str(), &info) != TPD_OK) return g;
    g.iteration = info.iteration;
    tpd_model_layout lay;
    tpd_model_layout_init(&info.cfg, 1, 0, 1, 0, &lay);
    for (int p = 0; p < TPD_P_COUNT; p++)
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++) {
            if (!info.has_kind[k]) continue;
            g.t[p][k].resize(tpd_model_layout_global_numel(&lay, (tpd_param)p));
            if (tpd_ckpt_read_global(&info, (tpd_param)p, (tpd_ckpt_kind)k, g.t[p][k].data()) !=
                TPD_OK)
                g.t[p][k].clear();
        }
    tpd_ckpt_close(&info);
    return g;
}

} // namespace ckt
