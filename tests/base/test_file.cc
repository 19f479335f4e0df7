// base/file.h's one way to open an input: a regular file opens (blocking reads, as any
// fd), anything else (a FIFO, a directory, a device) is refused at once with its kind.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include "base/file.h"
}

namespace {

std::string scratch(const char *name) {
    std::string p = testing::TempDir() + "tripod_file_" + std::to_string(getpid()) + "_" + name;
    unlink(p.c_str());
    return p;
}

TEST(File, OnlyRegularFilesOpenAndNothingBlocks) {
    std::string reg = scratch("reg"), fifo = scratch("fifo");
    FILE *w = fopen(reg.c_str(), "w");
    ASSERT_NE(w, nullptr);
    fputs("abc", w);
    fclose(w);
    int err = -7;
    int fd = tpd_file_open_read(reg.c_str(), &err);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(err, 0);
    EXPECT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0); // the caller's reads block, as usual
    EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    close(fd);

    // a FIFO with no writer: a plain open() would wait here forever
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    EXPECT_EQ(tpd_file_open_read(fifo.c_str(), &err), -1);
    EXPECT_LT(err, 0);
    EXPECT_EQ(std::string(tpd_file_strerror(err)).find("it is a FIFO, and only regular files"), 0u)
        << tpd_file_strerror(err);
    EXPECT_EQ(tpd_file_fopen_read(fifo.c_str(), &err), nullptr);
    char *data = nullptr;
    EXPECT_EQ(tpd_file_read_all(fifo.c_str(), &data, nullptr, &err), TPD_ERR_IO);
    EXPECT_NE(std::string(tpd_file_strerror(err)).find("a FIFO"), std::string::npos);
    char why[256];
    EXPECT_EQ(tpd_file_check_text(fifo.c_str(), 1 << 20, why, sizeof why), TPD_ERR_INVALID);
    EXPECT_NE(std::string(why).find("a FIFO"), std::string::npos) << why;

    EXPECT_EQ(tpd_file_open_read("/tmp", &err), -1);
    EXPECT_NE(std::string(tpd_file_strerror(err)).find("a directory"), std::string::npos);
    EXPECT_EQ(tpd_file_open_read("/dev/null", &err), -1);
    EXPECT_NE(std::string(tpd_file_strerror(err)).find("a character device"), std::string::npos);
    EXPECT_EQ(tpd_file_open_read((reg + ".missing").c_str(), &err), -1);
    EXPECT_EQ(err, ENOENT);
    EXPECT_STREQ(tpd_file_strerror(err), strerror(ENOENT));
    unlink(reg.c_str());
    unlink(fifo.c_str());
}

} // namespace
