/* The error budget of `tripod verify --device cuda`: how far the cuda backend's bf16 recipe
 * may drift from the cpu backend's fp32 over the rehearsal's steps, derived from bf16's
 * rounding (verify.h states the formulas; this file is their one implementation).
 *
 * Rounding. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 (half an ulp of 1; fp32's
 * is 2^-24). Every tensor the recipe keeps in bf16 is rounded once where it is written, a
 * relative error of at most u; a GEMM of depth K sums its bf16 products in fp32, adding at
 * most K x 2^-24 (Higham's gamma_K) relative to the sum of the products' magnitudes.
 *
 * Rounding points in series through one layer's forward, as the cuda backend writes them:
 * GPT's block 15 (the first norm's output; QKV's weight copy and output; the attention
 * probabilities before P.V and the attention's output; the projection's weight copy and
 * output; the residual sum; the second norm's output; fc's weight copy, output and GELU;
 * fc-projection's weight copy and output; the residual sum), SwiGLU 2 more (gate and up:
 * two weight copies and outputs and their product in place of one weight, output and GELU),
 * RoPE 1 more (its output). Outside the layers 5 (the embedding's weight copies and sum, the
 * final norm, the output layer's weight, the logits).
 *
 * Independent roundings add in quadrature (a random walk, the probabilistic analysis of
 * Higham and Mary 2019: sqrt(n) u rather than the worst case n u), so the forward's
 * relative error at the logits is
 *     e_fwd = u sqrt(R L + 5) + K_f 2^-24,  K_f = max(hidden, FFN, sequence) (the deepest
 *                                          forward GEMM: fc-projection's or P.V's),
 * and a weight gradient, which multiplies a forward activation by a backward gradient that
 * went back through as many roundings again,
 *     e_bwd = u sqrt(2 (R L + 5) + r_g) + K_b 2^-24,  K_b = max(K_f, the step's tokens over
 *                                                  the DP group) (the weight gradient sums
 *                                                  every token of the step in fp32),
 * with r_g = 0 under fp32 main gradients and M + DP - 1 under bf16 ones (each micro-batch's
 * running sum and each hop of the DP reduction rounded).
 *
 * Steps. Step s starts from parameters that already differ by the earlier steps'
 * differences, and its gradients see them: the differences grow with the steps, taken
 * here as linear in s (the bound for steps of a bounded size; a random walk would grow as
 * sqrt(s)).
 *
 * Loss. A token's loss is logsumexp(z) - z_target: a relative error e in the logits z
 * moves it by at most 2 e ||z||_inf, which is below e times the loss while ||z||_inf is
 * below half the loss (at initialization ||z||_inf is about 1 and the loss about ln V).
 * The activations' roundings are independent from token to token, so the mean over the
 * step's N tokens has 1/sqrt(N) of it (the weights' roundings, shared by every token,
 * enter only through the gradient, to first order):
 *     loss(s) = e_fwd s / sqrt(N).
 * Gradient norm. The global norm's relative error is at most the largest of its tensors':
 *     norm(s) = e_bwd s.
 * Parameters. In AdamW's first steps m^/sqrt(v^) is about +-1: every element moves by about
 * lr a step in the sign of its gradient. Where an element's fp32 gradient is smaller than
 * the bf16 error (e_bwd relative to the tensor's scale; a fraction kappa e_bwd of them,
 * kappa = sqrt(2/pi), for gradients about normal around 0), its sign can flip and the two
 * runs step 2 lr apart. If the same elements flip at every step, after S steps the
 * difference over a tensor, relative to how far the fp32 run moved it, is
 *     params = ||theta_cuda - theta_cpu|| / ||theta_cpu - theta_0|| = 2 sqrt(kappa e_bwd S).
 * It is independent of lr (both the difference and the movement scale with it). A budget
 * of 1 or more cannot tell a tensor that did not move from one that moved right.
 *
 * No safety factor is added. tools/bf16_emulate.py (the recipe emulated in PyTorch on the
 * cpu by rounding at these points; the cuda kernels' own orders of summation differ)
 * measures, worst of 8 seeds over 3 steps, the shrunken demo (4 layers) 28 to 120 times
 * below the loss and grad-norm budgets and 3.5 times below the parameters' (0.19 of
 * 0.65); at 48 layers 28 to 150 times below, and the parameters at 0.25 against a budget
 * past 1. These are estimates of typical sizes, not bounds: a first GPU run that lands
 * near a budget is worth reading before it is believed either way. */
#include <math.h>

#include "engine/verify/verify.h"

int tpd_verify_budget_rounds_per_layer(const tpd_config *cfg) {
    return 15 + (cfg->model.swiglu ? 2 : 0) +
           (cfg->model.position_embedding_type == TPD_POS_ROPE ? 1 : 0);
}

void tpd_verify_budget_shape(const tpd_config *small, int steps, int dp, tpd_verify_budget_in *in) {
    const tpd_config_model *m = &small->model;
    int T = m->seq_length, C = m->hidden_size, F = m->ffn_hidden_size;
    int mbs = small->training.micro_batch_size, gbs = small->training.global_batch_size;
    in->layers = m->num_layers;
    in->rounds_per_layer = tpd_verify_budget_rounds_per_layer(small);
    in->depth_fwd = C > F ? C : F;
    if (T > in->depth_fwd) in->depth_fwd = T;
    in->tokens = (double)gbs * T;
    in->depth_wgrad = in->tokens > in->depth_fwd ? in->tokens : in->depth_fwd;
    in->grad_rounds = 0;
    if (small->training.precision == TPD_PRECISION_BF16 &&
        !small->training.accumulate_allreduce_grads_in_fp32) {
        int per = mbs * (dp > 0 ? dp : 1);
        in->grad_rounds = (per > 0 ? gbs / per : 1) + (dp > 1 ? dp - 1 : 0);
    }
    in->steps = steps;
}

void tpd_verify_budget_compute(const tpd_verify_budget_in *in, tpd_verify_budget *b_p) {
    tpd_verify_budget b;
    b.in = *in;
    double n = (double)in->rounds_per_layer * in->layers + TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE;
    b.eps_fwd = TPD_VERIFY_BF16_U * sqrt(n) + in->depth_fwd * TPD_VERIFY_FP32_U;
    b.eps_bwd =
        TPD_VERIFY_BF16_U * sqrt(2 * n + in->grad_rounds) + in->depth_wgrad * TPD_VERIFY_FP32_U;
    b.params = 2 * sqrt(TPD_VERIFY_BUDGET_KAPPA * b.eps_bwd * in->steps);
    *b_p = b;
}

double tpd_verify_budget_loss(const tpd_verify_budget *b, int step) {
    return b->eps_fwd * step / sqrt(b->in.tokens > 1 ? b->in.tokens : 1);
}

double tpd_verify_budget_norm(const tpd_verify_budget *b, int step) {
    return b->eps_bwd * step;
}
