// base/spawn: a program runs with its argument vector as given (no shell reads it), its
// exit status comes back, and one that cannot start is an error naming it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

extern "C" {
#include "base/spawn.h"
}

TEST(Spawn, ArgumentsReachTheProgramVerbatim) {
    const char *hostile = "x'; touch PWNED; echo '$(id)`id`";
    const char *argv[] = {"printf", "%s", hostile, nullptr};
    char *out = nullptr;
    size_t len = 0;
    int code = -1;
    ASSERT_EQ(tpd_spawn_capture(argv, TPD_SPAWN_STDOUT, &out, &len, &code), TPD_OK);
    EXPECT_EQ(code, 0);
    EXPECT_EQ(std::string(out, len), hostile);
    free(out);
}

TEST(Spawn, ExitStatusAndSignalComeBack) {
    int code = -1;
    const char *ok[] = {"true", nullptr}, *bad[] = {"false", nullptr};
    ASSERT_EQ(tpd_spawn_run(ok, &code), TPD_OK);
    EXPECT_EQ(code, 0);
    ASSERT_EQ(tpd_spawn_run(bad, &code), TPD_OK);
    EXPECT_EQ(code, 1);
    // the shell's convention: 128 + the signal
    const char *killed[] = {"sh", "-c", "kill -TERM $$", nullptr};
    ASSERT_EQ(tpd_spawn_run(killed, &code), TPD_OK);
    EXPECT_EQ(code, 128 + 15);
}

TEST(Spawn, StderrIsCapturedWhenAsked) {
    const char *argv[] = {"sh", "-c", "echo out; echo err >&2", nullptr};
    char *out = nullptr;
    int code = -1;
    ASSERT_EQ(tpd_spawn_capture(argv, TPD_SPAWN_STDERR, &out, nullptr, &code), TPD_OK);
    EXPECT_EQ(std::string(out), "err\n");
    free(out);
}

TEST(Spawn, AMissingProgramIsAnErrorNamingIt) {
    const char *argv[] = {"tpd-no-such-program", nullptr};
    int code = -1;
    EXPECT_EQ(tpd_spawn_run(argv, &code), TPD_ERR_IO);
    EXPECT_NE(std::string(tpd_last_error()).find("tpd-no-such-program: cannot run"),
              std::string::npos)
        << tpd_last_error();
    EXPECT_EQ(code, -1); // written only on success
}
