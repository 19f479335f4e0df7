/* The optimizer step over a rank's flat buffers: the global gradient norm (each parameter
 * counted once), clipping and AdamW on the owned ranges (weight decay on 2-D weights
 * only). The gradient sums before it and the ZeRO-1 all-gather after it are in
 * grad_sync.h. */
#ifndef TPD_ENGINE_OPTIMIZER_H
#define TPD_ENGINE_OPTIMIZER_H

#include "engine/model/model.h"
#include "parallel/data/dp.h"
#include "parallel/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Global L2 norm of the reduced gradients, identical on every rank. hcomms: the host
 * (MPI) communicators, since the partial sums are host scalars. */
tpd_status tpd_optim_grad_norm(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                               double *norm_p);
/* The same norm of the weights (fp32 master weights where kept), for the log's params
 * norm. Collective like tpd_optim_grad_norm. */
tpd_status tpd_optim_params_norm(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                 double *norm_p);

/* The inner update on the owned ranges with gradients scaled by grad_scale: AdamW, or
 * plain SGD under optimizer.type sgd (weight decay on 2-D weights either way). step is
 * 1-based. */
tpd_status tpd_optim_update(tpd_model *m, const tpd_dp_plan *dpp, double lr, double grad_scale,
                            int step);

#ifdef __cplusplus
}
#endif
#endif
