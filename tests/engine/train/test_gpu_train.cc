// The cuda backend inside the real training loop, against the cpu backend (label gpu;
// skips without a device):
//   one step of the tiny model, bf16 on the GPU against fp32 on the CPU: relative gradient
//   error at most 0.08 per tensor, loss within 1e-2;
//   50 steps track the CPU loss curve within 2%;
//   16 micro-batches accumulated with fp32 main gradients
//   (training.accumulate_allreduce_grads_in_fp32 true) end closer to the fp32 CPU gradients
//   than with bf16 ones (false): over all parameters the relative error is smaller, and
//   at most 0.08 per tensor;
//   DiLoCo's outer step and plain SGD on the device kernels track the CPU over 9 steps
//   (fp32: loss within 1e-4 relative; bf16 with fp32 masters: 2%);
//   the mixture of experts over 10 steps: fp32 on the GPU within 1e-4 of the CPU, bf16
//   within 2% of fp32 on the CPU, and its first step's gradients within 0.08 per tensor of
//   the cpu backend's bf16 (the same recipe, so the same routing).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/gpu.h"
#include "common/tiny.h"

extern "C" {
#include "engine/train/train.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data;

tpd_config gpu_config(const char *device, const char *precision) {
    tpd_config c = tiny::config(g_data);
    c.model.hidden_size = 64;
    c.model.ffn_hidden_size = 256;
    c.model.seq_length = 64;
    c.model.max_position_embeddings = 64;
    c.training.micro_batch_size = 4;
    c.training.global_batch_size = 8;
    c.optimizer.lr = 1e-3;
    tiny::set(c.training.device, "training.device", device);
    tiny::set(c.training.precision, "training.precision", precision);
    return c;
}

// Gradients of parameter p as fp32 on the host (single rank), layer piece after piece.
std::vector<float> host_grad(tpd_trainer *tr, tpd_param p) {
    const tpd_model *m = tpd_trainer_model(tr);
    const tpd_param_slice &s = m->plan.lay.p[p];
    size_t n = m->plan.numel_padded, piece = (size_t)s.rows * s.cols;
    std::vector<float> all(n), out;
    void *src = m->grads, *tmp = nullptr;
    if (tpd_kern_grad_dtype(m->kb) != TPD_DTYPE_F32) {
        EXPECT_EQ(tpd_kern_alloc(m->kb, n * 4, &tmp), TPD_OK);
        EXPECT_EQ(tpd_kern_cast(m->kb, tmp, TPD_DTYPE_F32, src, tpd_kern_grad_dtype(m->kb), n),
                  TPD_OK);
        src = tmp;
    }
    EXPECT_EQ(tpd_kern_copy_to_host(m->kb, all.data(), src, n * 4), TPD_OK);
    if (tmp) tpd_kern_free(m->kb, tmp);
    for (int l = 0; l < s.layers; l++) {
        const float *at = all.data() + tpd_model_layout_piece(&m->plan.lay, p, l);
        out.insert(out.end(), at, at + piece);
    }
    return out;
}

// Relative error of the gradients of `b` against the reference `a`: per tensor, and over
// all of them (sum of squared differences over sum of squares).
struct GradError {
    std::vector<double> per;
    double all;
};

GradError grad_error(tpd_trainer *a, tpd_trainer *b) {
    GradError e;
    double num_all = 0, den_all = 0;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        std::vector<float> ga = host_grad(a, (tpd_param)p), gb = host_grad(b, (tpd_param)p);
        double num = 0, den = 0;
        for (size_t i = 0; i < ga.size() && i < gb.size(); i++) {
            num += ((double)gb[i] - ga[i]) * ((double)gb[i] - ga[i]);
            den += (double)ga[i] * ga[i];
        }
        e.per.push_back(std::sqrt(num / (den > 0 ? den : 1)));
        num_all += num;
        den_all += den;
    }
    e.all = std::sqrt(num_all / (den_all > 0 ? den_all : 1));
    return e;
}

TEST(GpuTrain, OneStepBf16AgainstCpuFp32) {
    TPD_SKIP_WITHOUT_GPU();
    tpd_config ccpu = gpu_config("cpu", "fp32"), cgpu = gpu_config("cuda", "bf16");
    tpd_trainer *a = nullptr, *b = nullptr;
    ASSERT_EQ(tpd_trainer_create(&ccpu, g_world, &a), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&cgpu, g_world, &b), TPD_OK);
    tpd_step_stats sa, sb;
    ASSERT_EQ(tpd_trainer_step(a, &sa), TPD_OK);
    ASSERT_EQ(tpd_trainer_step(b, &sb), TPD_OK);
    EXPECT_NEAR(sb.lm_loss, sa.lm_loss, 1e-2);
    GradError e = grad_error(a, b);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        printf("%-9s relative gradient error bf16 GPU vs fp32 CPU: %.4f\n",
               tpd_param_get_info((tpd_param)p)->name, e.per[p]);
        EXPECT_LE(e.per[p], 0.08) << tpd_param_get_info((tpd_param)p)->name;
    }
    tpd_trainer_destroy(b);
    tpd_trainer_destroy(a);
}

TEST(GpuTrain, Fp32MainGradientsAccumulateCloserToCpu) {
    TPD_SKIP_WITHOUT_GPU();
    // 16 micro-batches of 2 samples: bf16 gradients round the running sum 16 times
    tpd_config ccpu = gpu_config("cpu", "fp32"), con = gpu_config("cuda", "bf16");
    ccpu.training.micro_batch_size = con.training.micro_batch_size = 2;
    ccpu.training.global_batch_size = con.training.global_batch_size = 32;
    tpd_config coff = con;
    con.training.accumulate_allreduce_grads_in_fp32 = 1;
    coff.training.accumulate_allreduce_grads_in_fp32 = 0;
    tpd_trainer *ref = nullptr, *on = nullptr, *off = nullptr;
    ASSERT_EQ(tpd_trainer_create(&ccpu, g_world, &ref), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&con, g_world, &on), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&coff, g_world, &off), TPD_OK);
    EXPECT_EQ(tpd_kern_grad_dtype(tpd_trainer_model(on)->kb), TPD_DTYPE_F32);
    EXPECT_EQ(tpd_kern_grad_dtype(tpd_trainer_model(off)->kb), TPD_DTYPE_BF16);
    EXPECT_EQ(tpd_trainer_model(on)->plan.mem.grads, 2 * tpd_trainer_model(off)->plan.mem.grads);
    tpd_step_stats s;
    ASSERT_EQ(tpd_trainer_step(ref, &s), TPD_OK);
    ASSERT_EQ(tpd_trainer_step(on, &s), TPD_OK);
    ASSERT_EQ(tpd_trainer_step(off, &s), TPD_OK);
    GradError eon = grad_error(ref, on), eoff = grad_error(ref, off);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const char *name = tpd_param_get_info((tpd_param)p)->name;
        printf("%-9s relative gradient error vs fp32 CPU, 16 micro-batches: fp32 main grads "
               "%.5f, bf16 grads %.5f\n",
               name, eon.per[p], eoff.per[p]);
        EXPECT_LE(eon.per[p], 0.08) << name;
    }
    printf("all parameters: fp32 main grads %.5f, bf16 grads %.5f\n", eon.all, eoff.all);
    EXPECT_LT(eon.all, eoff.all);
    tpd_trainer_destroy(off);
    tpd_trainer_destroy(on);
    tpd_trainer_destroy(ref);
}

TEST(GpuTrain, FiftyStepsTrackCpuLoss) {
    TPD_SKIP_WITHOUT_GPU();
    tpd_config ccpu = gpu_config("cpu", "fp32"), cgpu = gpu_config("cuda", "bf16");
    ccpu.training.train_iters = cgpu.training.train_iters = 50;
    tpd_trainer *a = nullptr, *b = nullptr;
    ASSERT_EQ(tpd_trainer_create(&ccpu, g_world, &a), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&cgpu, g_world, &b), TPD_OK);
    double worst = 0;
    for (int i = 0; i < 50; i++) {
        tpd_step_stats sa, sb;
        ASSERT_EQ(tpd_trainer_step(a, &sa), TPD_OK);
        ASSERT_EQ(tpd_trainer_step(b, &sb), TPD_OK);
        double rel = std::fabs(sb.lm_loss - sa.lm_loss) / sa.lm_loss;
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 0.02) << "step " << i + 1 << ": gpu " << sb.lm_loss << " cpu " << sa.lm_loss;
    }
    printf("50 steps: worst relative loss difference bf16 GPU vs fp32 CPU %.4f\n", worst);
    tpd_trainer_destroy(b);
    tpd_trainer_destroy(a);
}

TEST(GpuTrain, DilocoOuterStepAndSgdTrackCpu) {
    TPD_SKIP_WITHOUT_GPU();
    // one replica: the outer step (pseudo-gradient, Nesterov, the weights from sync) runs
    // on the device kernels every 3 steps; fp32 on both backends, then bf16 with fp32
    // masters on the GPU; AdamW and plain SGD inside
    for (int sgd = 0; sgd < 2; sgd++) {
        for (const char *prec : {"fp32", "bf16"}) {
            tpd_config ccpu = gpu_config("cpu", "fp32"), cgpu = gpu_config("cuda", prec);
            for (tpd_config *c : {&ccpu, &cgpu}) {
                c->parallel.dp_sync = TPD_DP_SYNC_DILOCO;
                c->diloco.sync_interval = 3;
                c->training.train_iters = 9;
                if (sgd) c->optimizer.type = TPD_OPTIM_SGD, c->optimizer.lr = 0.05;
            }
            tpd_trainer *a = nullptr, *b = nullptr;
            ASSERT_EQ(tpd_trainer_create(&ccpu, g_world, &a), TPD_OK);
            ASSERT_EQ(tpd_trainer_create(&cgpu, g_world, &b), TPD_OK);
            double tol = strcmp(prec, "fp32") ? 0.02 : 1e-4, worst = 0;
            for (int i = 0; i < 9; i++) {
                tpd_step_stats sa, sb;
                ASSERT_EQ(tpd_trainer_step(a, &sa), TPD_OK);
                ASSERT_EQ(tpd_trainer_step(b, &sb), TPD_OK);
                EXPECT_EQ(sb.outer_applied, sa.outer_applied) << "step " << i + 1;
                double rel = std::fabs(sb.lm_loss - sa.lm_loss) / sa.lm_loss;
                worst = std::max(worst, rel);
                EXPECT_LE(rel, tol) << (sgd ? "SGD " : "AdamW ") << prec << " step " << i + 1;
            }
            printf("DiLoCo H 3, %s inside, %s GPU vs fp32 CPU: worst relative loss difference "
                   "%.2e\n",
                   sgd ? "SGD" : "AdamW", prec, worst);
            tpd_trainer_destroy(b);
            tpd_trainer_destroy(a);
        }
    }
}

// Top-2 of 4 GELU experts with a gated shared expert and both router losses.
void moe_config(tpd_config &c) {
    c.model.num_moe_experts = 4;
    c.model.moe_router_topk = 2;
    c.model.moe_ffn_hidden_size = 64;
    c.model.moe_shared_expert_intermediate_size = 32;
    c.model.moe_shared_expert_gate = 1;
    c.model.moe_aux_loss_coeff = 0.01;
    c.model.moe_z_loss_coeff = 0.001;
    c.training.train_iters = 10;
}

// The router runs on the host on both backends, from the logits the matmul wrote: bf16 on
// the GPU rounds them, which can flip a token's near tie against fp32, so the one-step
// gradients are held to the cpu backend in bf16 (its routing is the GPU's) and the losses
// to fp32 on the CPU.
TEST(GpuTrain, MoeBf16TracksCpuFp32) {
    TPD_SKIP_WITHOUT_GPU();
    tpd_config ccpu = gpu_config("cpu", "fp32"), cbf = gpu_config("cpu", "bf16");
    tpd_config cgpu = gpu_config("cuda", "bf16"), cg32 = gpu_config("cuda", "fp32");
    for (tpd_config *c : {&ccpu, &cbf, &cgpu, &cg32})
        moe_config(*c);
    tpd_trainer *a = nullptr, *r = nullptr, *b = nullptr, *f = nullptr;
    ASSERT_EQ(tpd_trainer_create(&ccpu, g_world, &a), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&cbf, g_world, &r), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&cgpu, g_world, &b), TPD_OK);
    ASSERT_EQ(tpd_trainer_create(&cg32, g_world, &f), TPD_OK);
    double worst = 0, worst32 = 0;
    for (int i = 0; i < 10; i++) {
        tpd_step_stats sa, sr, sb, sf;
        ASSERT_EQ(tpd_trainer_step(a, &sa), TPD_OK);
        ASSERT_EQ(tpd_trainer_step(r, &sr), TPD_OK);
        ASSERT_EQ(tpd_trainer_step(b, &sb), TPD_OK);
        ASSERT_EQ(tpd_trainer_step(f, &sf), TPD_OK);
        ASSERT_TRUE(sb.moe && sf.moe);
        if (i == 0) {
            EXPECT_NEAR(sb.lm_loss, sa.lm_loss, 1e-2);
            GradError e = grad_error(r, b);
            for (int p = 0; p < TPD_P_COUNT; p++) {
                printf("%-9s MoE relative gradient error bf16 GPU vs bf16 CPU: %.4f\n",
                       tpd_param_get_info((tpd_param)p)->name, e.per[p]);
                EXPECT_LE(e.per[p], 0.08) << tpd_param_get_info((tpd_param)p)->name;
            }
        }
        double rel = std::fabs(sb.lm_loss - sa.lm_loss) / sa.lm_loss;
        double rel32 = std::fabs(sf.lm_loss - sa.lm_loss) / sa.lm_loss;
        worst = std::max(worst, rel);
        worst32 = std::max(worst32, rel32);
        EXPECT_LE(rel, 0.02) << "step " << i + 1 << ": gpu " << sb.lm_loss << " cpu " << sa.lm_loss;
        EXPECT_LE(rel32, 1e-4) << "fp32 step " << i + 1 << ": gpu " << sf.lm_loss << " cpu "
                               << sa.lm_loss;
        EXPECT_LE(std::fabs(sf.moe_aux_loss - sa.moe_aux_loss), 1e-4 * sa.moe_aux_loss)
            << "fp32 step " << i + 1 << ": load-balancing loss";
    }
    printf("MoE, 10 steps: worst relative loss difference against fp32 CPU: bf16 GPU %.4f, "
           "fp32 GPU %.2e\n",
           worst, worst32);
    tpd_trainer_destroy(f);
    tpd_trainer_destroy(b);
    tpd_trainer_destroy(r);
    tpd_trainer_destroy(a);
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    g_data = tiny::write_corpus(tiny::temp_prefix("gpu_corpus"));
    int rc = RUN_ALL_TESTS();
    tiny::remove_corpus(g_data);
    tpd_comm_mpi_finish(g_world);

    return rc;
}
