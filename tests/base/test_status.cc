// base/status: an error is printed once and kept as the calling thread's last error; a quiet
// scope keeps it without printing; tpd_fail and tpd_fail_nomem return their code; the
// exit-code map gives every status its class.
#include <gtest/gtest.h>

#include <string>
#include <thread>

extern "C" {
#include "base/status.h"
}

namespace {

// What one call printed on stderr.
template <typename F> std::string Stderr(F f) {
    testing::internal::CaptureStderr();
    f();
    return testing::internal::GetCapturedStderr();
}

TEST(Status, AnErrorIsPrintedOnceAndKept) {
    tpd_last_error_clear();
    EXPECT_STREQ(tpd_last_error(), "");
    std::string out = Stderr([] { tpd_log_error("%s: cannot read: %s", "a.yaml", "denied"); });
    EXPECT_EQ(out, "tripod: error: a.yaml: cannot read: denied\n");
    EXPECT_STREQ(tpd_last_error(), "a.yaml: cannot read: denied");
    // warnings and info are no errors: the last error stays
    Stderr([] { tpd_log_warn("only a warning"); });
    EXPECT_STREQ(tpd_last_error(), "a.yaml: cannot read: denied");
    tpd_last_error_clear();
    EXPECT_STREQ(tpd_last_error(), "");
}

TEST(Status, FailReturnsItsCodeAndNomemNamesTheBytes) {
    tpd_status st = TPD_OK;
    std::string out = Stderr([&] { st = tpd_fail(TPD_ERR_FORMAT, "x.idx: bad magic at %d", 0); });
    EXPECT_EQ(st, TPD_ERR_FORMAT);
    EXPECT_EQ(out, "tripod: error: x.idx: bad magic at 0\n");
    out = Stderr([&] { st = tpd_fail_nomem("the trainer", 123456); });
    EXPECT_EQ(st, TPD_ERR_NOMEM);
    EXPECT_STREQ(tpd_last_error(), "out of memory for the trainer (123456 bytes)");
    EXPECT_EQ(out, "tripod: error: out of memory for the trainer (123456 bytes)\n");
}

tpd_status FailAndUndo(int *undone_p) {
    tpd_status st = TPD_OK;
    TPD_FAIL_GOTO(TPD_ERR_IO, st, undo, "%s: write failed", "out.bin");
    return TPD_ERR_INTERNAL; // not reached
undo:
    *undone_p = 1;
    return st;
}

TEST(Status, FailGotoKeepsTheCodeAndJumps) {
    int undone = 0;
    tpd_status st = TPD_OK;
    std::string out = Stderr([&] { st = FailAndUndo(&undone); });
    EXPECT_EQ(st, TPD_ERR_IO);
    EXPECT_EQ(undone, 1);
    EXPECT_EQ(out, "tripod: error: out.bin: write failed\n");
}

TEST(Status, AMessageMayQuoteTheErrorItWraps) {
    Stderr([] { tpd_log_error("split \"9,1\": the valid split is empty"); });
    // the argument is the buffer being written: formatted apart, so nothing is lost
    std::string out =
        Stderr([] { tpd_log_error("data set d (blend entry 2 of 3): %s", tpd_last_error()); });
    EXPECT_STREQ(tpd_last_error(),
                 "data set d (blend entry 2 of 3): split \"9,1\": the valid split is empty");
    EXPECT_EQ(out, std::string("tripod: error: ") + tpd_last_error() + "\n");
}

TEST(Status, AQuietScopeKeepsTheErrorWithoutPrintingIt) {
    std::string out = Stderr([] {
        tpd_log_quiet_begin();
        tpd_log_quiet_begin(); // scopes nest
        tpd_fail(TPD_ERR_INVALID, "probe: TP 3 does not divide 8 heads");
        tpd_log_quiet_end();
        tpd_fail(TPD_ERR_INVALID, "probe: still quiet");
        tpd_log_quiet_end();
    });
    EXPECT_EQ(out, "");
    EXPECT_STREQ(tpd_last_error(), "probe: still quiet");
    out = Stderr([] { tpd_log_error("loud again"); });
    EXPECT_EQ(out, "tripod: error: loud again\n");
    // an unmatched end is harmless: errors still print
    tpd_log_quiet_end();
    out = Stderr([] { tpd_log_error("still loud"); });
    EXPECT_EQ(out, "tripod: error: still loud\n");
}

TEST(Status, EachThreadHasItsOwnLastErrorAndQuietScope) {
    tpd_log_error("main thread's error");
    tpd_log_quiet_begin();
    std::string seen_by_thread = "unset", out;
    out = Stderr([&] {
        std::thread t([&] {
            seen_by_thread = tpd_last_error();
            tpd_log_error("save thread's error"); // the main thread's quiet scope is not its
        });
        t.join();
    });
    tpd_log_quiet_end();
    EXPECT_EQ(seen_by_thread, "");
    EXPECT_EQ(out, "tripod: error: save thread's error\n");
    EXPECT_STREQ(tpd_last_error(), "main thread's error");
}

TEST(Status, TheExitCodeMapGivesEveryStatusItsClass) {
    EXPECT_EQ(tpd_status_exit_code(TPD_OK), TPD_EXIT_OK);
    EXPECT_EQ(tpd_status_exit_code(TPD_ERR_INVALID), TPD_EXIT_CONFIG);
    EXPECT_EQ(tpd_status_exit_code(TPD_ERR_COMM), TPD_EXIT_COMM);
    EXPECT_EQ(tpd_status_exit_code(TPD_ERR_DIVERGED), TPD_EXIT_DIVERGED);
    for (tpd_status st : {TPD_ERR_IO, TPD_ERR_FORMAT, TPD_ERR_NOMEM, TPD_ERR_UNSUPPORTED,
                          TPD_ERR_BACKEND, TPD_ERR_INTERNAL, TPD_ERR_INTERRUPTED})
        EXPECT_EQ(tpd_status_exit_code(st), TPD_EXIT_FAILURE) << tpd_status_str(st);
    // the codes a launcher tells apart are distinct
    EXPECT_NE(TPD_EXIT_COMM, TPD_EXIT_FAILURE);
    EXPECT_NE(TPD_EXIT_DIVERGED, TPD_EXIT_CONFIG);
}

} // namespace
