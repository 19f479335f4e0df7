// Shared by the checkpoint tests: fresh directories, whole-file helpers, a single-process
// communicator (for a writer child that runs without MPI), and global-tensor reads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/tiny.h"

extern "C" {
#include "engine/checkpoint.h"
#include "engine/train.h"
#include "parallel/comm.h"
}

namespace ckt {

inline std::string fresh_dir(const std::string &path) {
    std::string cmd = "rm -rf '" + path + "'";
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not clean %s\n", path.c_str());
    return path;
}

inline std::string slurp(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

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
            if (tpd_ckpt_read_global(&info, (tpd_param)p, (tpd_ckpt_kind)k, g.t[p][k].data()) != TPD_OK)
                g.t[p][k].clear();
        }
    tpd_ckpt_close(&info);
    return g;
}

// ---- a communicator of one process, without MPI ----

inline tpd_status self_allreduce(tpd_comm *, const void *s, void *r, size_t n, tpd_dtype dt, tpd_comm_op, void *) {
    if (s != r) memmove(r, s, n * tpd_dtype_size(dt));
    return TPD_OK;
}
inline tpd_status self_rs(tpd_comm *, const void *s, void *r, size_t n, tpd_dtype dt, tpd_comm_op, void *) {
    if (s != r) memmove(r, s, n * tpd_dtype_size(dt));
    return TPD_OK;
}
inline tpd_status self_allgather(tpd_comm *, const void *s, void *r, size_t n, tpd_dtype dt, void *) {
    if (s != r) memmove(r, s, n * tpd_dtype_size(dt));
    return TPD_OK;
}
inline tpd_status self_bcast(tpd_comm *, void *, size_t, tpd_dtype, int, void *) { return TPD_OK; }
inline tpd_status self_p2p(tpd_comm *, const void *, size_t, tpd_dtype, int, int, void *, tpd_comm_req **) {
    return TPD_ERR_UNSUPPORTED;
}
inline tpd_status self_recv(tpd_comm *, void *, size_t, tpd_dtype, int, int, void *, tpd_comm_req **) {
    return TPD_ERR_UNSUPPORTED;
}
inline tpd_status self_wait(tpd_comm *, tpd_comm_req *) { return TPD_OK; }
inline tpd_status self_noop(tpd_comm *) { return TPD_OK; }
inline tpd_status self_sync(tpd_comm *, void *) { return TPD_OK; }
inline void self_abort(tpd_comm *) {}
inline void self_destroy(tpd_comm *c) { delete c; }
tpd_status self_split(tpd_comm *c, int color, int key, tpd_comm **out_p);

inline const tpd_comm_ops *self_ops() {
    static tpd_comm_ops ops = {"self", self_allreduce, self_rs, self_allgather, self_bcast,
                               self_p2p, self_recv, self_wait, self_noop, self_noop, self_noop,
                               self_sync, self_split, self_abort, self_destroy};
    return &ops;
}

inline tpd_comm *self_comm() {
    tpd_comm *c = new tpd_comm();
    c->ops = self_ops();
    c->rank = 0;
    c->size = 1;
    snprintf(c->name, sizeof c->name, "self");
    return c;
}

inline tpd_status self_split(tpd_comm *, int color, int, tpd_comm **out_p) {
    *out_p = color < 0 ? nullptr : self_comm();
    return TPD_OK;
}

} // namespace ckt
