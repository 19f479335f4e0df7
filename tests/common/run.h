// Runs a program (the tripod binary) from a test without a shell: its exit status, and
// the streams asked for (TPD_SPAWN_STDOUT, TPD_SPAWN_STDERR) in *out.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

extern "C" {
#include "base/spawn.h"
}

namespace tpdtest {

// The exit status, or -1 (and the reason in *out) when it could not start.
inline int run(std::initializer_list<const char *> args, int streams, std::string *out) {
    std::vector<const char *> argv(args);
    argv.push_back(nullptr);
    char *text = nullptr;
    int code = -1;
    if (tpd_spawn_capture(argv.data(), streams, &text, nullptr, &code) != TPD_OK) {
        *out = tpd_last_error();
        return -1;
    }
    *out = text;
    free(text);
    return code;
}

} // namespace tpdtest
