// The subcommands' one argument parser (engine/cli/args.h) and their one error path: each
// error is logged once and the exit code comes from the status (tpd_status_exit_code) or is
// TPD_EXIT_CONFIG for a bad command line; generate and config show are commands of their own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" {
#include "base/file.h"
#include "base/status.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
}

namespace {

// argv of a command line ("generate", "ck", "--seed", "5").
struct Argv {
    std::vector<std::string> s;
    std::vector<char *> p;
    explicit Argv(std::vector<std::string> v) : s(std::move(v)) {
        for (std::string &x : s)
            p.push_back(&x[0]);
    }
    int argc() const {
        return (int)p.size();
    }
    char **argv() {
        return p.data();
    }
};

struct CliRun {
    int rc;
    std::string err; // what it printed on stderr
};

CliRun RunCli(int (*cmd)(int, char **), std::vector<std::string> args) {
    Argv a(std::move(args));
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    int rc = cmd(a.argc(), a.argv());
    testing::internal::GetCapturedStdout();
    return {rc, testing::internal::GetCapturedStderr()};
}

size_t Count(const std::string &text, const std::string &what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        n++;
    return n;
}

const tpd_cli_opt kOpts[] = {{"--input", TPD_CLI_VALUES}, {"--out", 1}, {"--force", 0}, {NULL, 0}};

TEST(CliArgs, AListOptionTakesEveryValueUpToTheNextOption) {
    Argv a({"--input", "a.txt", "b=c.txt", "d.txt", "--force", "--out", "o", "--input", "e"});
    tpd_cli_args p;
    ASSERT_EQ(tpd_cli_args_parse_path("data prepare", a.argc(), a.argv(), kOpts, &p), TPD_OK);
    std::vector<std::string> got;
    for (int i = 0; i < p.n_opts; i++)
        got.push_back(std::string(p.opt_name[i]) + " " + (p.opt_value[i] ? p.opt_value[i] : "-"));
    EXPECT_EQ(got, (std::vector<std::string>{"--input a.txt", "--input b=c.txt", "--input d.txt",
                                             "--force -", "--out o", "--input e"}));
    EXPECT_EQ(p.config, nullptr);
    EXPECT_EQ(p.n_overrides, 0);
    tpd_cli_args_free(&p);
}

TEST(CliArgs, APathCommandTakesNoOverrides) {
    Argv a({"run=1/ck", "--out", "x"});
    tpd_cli_args p;
    ASSERT_EQ(tpd_cli_args_parse_path("export", a.argc(), a.argv(), kOpts, &p), TPD_OK);
    EXPECT_STREQ(p.config, "run=1/ck");
    EXPECT_EQ(p.n_overrides, 0);
    tpd_cli_args_free(&p);
    // a config command reads the same word as an override
    ASSERT_EQ(tpd_cli_args_parse("train", a.argc(), a.argv(), kOpts, &p), TPD_OK);
    EXPECT_EQ(p.config, nullptr);
    ASSERT_EQ(p.n_overrides, 1);
    EXPECT_STREQ(p.overrides[0], "run=1/ck");
    tpd_cli_args_free(&p);
}

TEST(CliArgs, ErrorsNameTheOptionAndAreLoggedOnce) {
    const struct {
        std::vector<std::string> args;
        const char *message;
    } cases[] = {
        {{"--input"}, "data prepare: --input needs a value"},
        {{"--input", "--force"}, "data prepare: --input needs a value"},
        {{"--out"}, "data prepare: --out needs a value"},
        {{"--bogus"}, "data prepare: unknown option '--bogus' (data prepare --help lists them)"},
        {{"a", "b"}, "data prepare: unexpected argument 'b' (one path, then options)"},
    };
    for (const auto &c : cases) {
        Argv a(c.args);
        tpd_cli_args p;
        testing::internal::CaptureStderr();
        tpd_status st = tpd_cli_args_parse_path("data prepare", a.argc(), a.argv(), kOpts, &p);
        std::string err = testing::internal::GetCapturedStderr();
        EXPECT_EQ(st, TPD_ERR_INVALID) << c.message;
        EXPECT_STREQ(tpd_last_error(), c.message);
        EXPECT_EQ(err, std::string("tripod: error: ") + c.message + "\n");
    }
}

TEST(CliArgs, IntegerListsAreStrictAndInRange) {
    int v[4], n = 0;
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_cli_int_list("plan", "--layout", "8,8,16", 1, 1 << 20, 3, 3, v, &n), TPD_OK);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(v[0] * 10000 + v[1] * 100 + v[2], 80816);
    EXPECT_EQ(tpd_cli_int_list("sweep", "--tp", "0", 0, 4, 1, 4, v, &n), TPD_OK);
    EXPECT_EQ(n, 1);
    // 4294967298 is 2^32 + 2: a %d would have read TP 2
    for (const char *bad :
         {"4294967298,1,1", "1,1", "1,1,1,1", "1,,1", "1,1,", ",1,1", " 1,1,1", "1, 1,1", "1,1,1x",
          "0,1,1", "1,1,1048577", "99999999999999999999,1,1", ""})
        EXPECT_EQ(tpd_cli_int_list("plan", "--layout", bad, 1, 1 << 20, 3, 3, v, &n),
                  TPD_ERR_INVALID)
            << bad;
    tpd_log_quiet_end();
    EXPECT_STREQ(tpd_last_error(), "plan: --layout '' must be a comma-separated list of 3 "
                                   "integers, each from 1 to 1048576");
}

TEST(CliErrors, LayoutsAndListsThatWouldWrapAreRefusedNamingTheOption) {
    std::string demo = std::string(tpd_source_dir()) + "/configs/demo.yaml";
    CliRun r = RunCli(tpd_cli_plan, {"plan", demo, "--layout", "4294967298,1,1"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "--layout '4294967298,1,1' must be a comma-separated list of 3"), 1u)
        << r.err;
    r = RunCli(tpd_cli_ckpt, {"import", "hf", "--format", "hf", "--output", "/nonexistent/x",
                              "--layout", "1,4294967298,1"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "--layout '1,4294967298,1' must be a comma-separated list of 3"), 1u)
        << r.err;
    r = RunCli(tpd_cli_sweep, {"sweep", demo, "--tp", "1,4294967298"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "--tp '1,4294967298' must be a comma-separated list of 1 to 16"), 1u)
        << r.err;
}

TEST(CliErrors, CheckpointCommandsTakeOnlyTheirOwnOptions) {
    CliRun r = RunCli(tpd_cli_ckpt, {"inspect", "ck", "--force"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "unknown option '--force'"), 1u) << r.err;
    r = RunCli(tpd_cli_ckpt, {"export", "ck", "--layout", "1,1,1"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "unknown option '--layout'"), 1u) << r.err;
    r = RunCli(tpd_cli_ckpt, {"import", "hf", "--format", "hf"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "tripod: error: import needs --format hf|llmc and --output DIR"), 1u)
        << r.err;
    r = RunCli(tpd_cli_ckpt, {"inspect"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "tripod: error: inspect needs a path"), 1u) << r.err;
}

TEST(CliErrors, ALibraryFailureIsPrintedOnceAndMapsToItsExitCode) {
    // the checkpoint library finds the missing directory and says so; the command only maps
    // the status (an i/o error: 1) and prints nothing more
    CliRun r = RunCli(tpd_cli_ckpt, {"inspect", "/nonexistent/tripod-ck"});
    EXPECT_EQ(r.rc, TPD_EXIT_FAILURE) << r.err;
    EXPECT_EQ(Count(r.err, "tripod: error:"), 1u) << r.err;
    EXPECT_EQ(Count(r.err, "/nonexistent/tripod-ck"), 1u) << r.err;
}

TEST(CliErrors, GenerateAndConfigShowAreCommandsOfTheirOwn) {
    CliRun r = RunCli(tpd_cli_generate, {"generate", "--help"});
    EXPECT_EQ(r.rc, TPD_EXIT_OK) << r.err;
    r = RunCli(tpd_cli_generate, {"generate", "ck", "--top-p", "0"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "tripod: error: generate: --top-p must be in (0, 1]"), 1u) << r.err;
    r = RunCli(tpd_cli_generate, {"generate", "ck", "--format", "hf"}); // export's option
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "unknown option '--format'"), 1u) << r.err;
    r = RunCli(tpd_cli_config, {"config", "show", "/nonexistent/tripod.yaml"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "tripod: error: /nonexistent/tripod.yaml: cannot read"), 1u) << r.err;
    r = RunCli(tpd_cli_config, {"config", "show"});
    EXPECT_EQ(r.rc, TPD_EXIT_CONFIG);
    EXPECT_EQ(Count(r.err, "tripod: error: config show: missing CONFIG.yaml"), 1u) << r.err;
}

} // namespace
