/* A run's --save: the weights to FILE.bin or FILE.safetensors (gathered to
 * rank 0 from a model in parts), or the full state to a directory (every
 * rank its slices where the strategy shards). */
#include "run.h"
#include "dtrain/io.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Whether the engine's strategy shards the optimizer: then every rank saves its slice. */
static bool sharded(const run *r) {
    size_t off, n;
    dt_engine_share(r->e, &off, &n);
    return off != 0 || n != dt_engine_get_config(r->e)->model.nparams; /* the store the engine trains (LoRA: the adapters) */
}

/* Whether this rank holds a part of the model: tensor-parallel slices, pipeline stages, or its experts. */
static bool in_parts(const run *r) {
    return r->mesh && (dt_mesh_size(r->mesh, DT_MESH_TP) > 1 || dt_mesh_size(r->mesh, DT_MESH_PP) > 1 || r->ep);
}

/* The weights file: rank 0 writes the model, gathered first from the ranks'
 * parts when it is split (TP, PP, EP: collective). */
static dt_status save_weights(run *r, int steps_done) {
    const char *path = r->c.save;
    dt_gpt2 *whole = r->m;
    dt_status st = DT_OK;
    if (in_parts(r)) st = dt_mesh_gather_gpt2(r->mesh, r->w, r->m, &whole);
    if (!st && r->rank == 0) {
        double t0 = dt_time_now();
        DT_TRACE_BEGIN(DT_TRACK_IO, "weights write", "\"step\":%d,\"files\":1", steps_done);
        st = dt_safetensors_path(path) ? dt_safetensors_save(path, whole, DT_F32) : dt_llmc_save(path, whole);
        DT_TRACE_END(DT_TRACK_IO);
        struct stat sb;
        if (!st && stat(path, &sb) == 0) dt_io_count(DT_IO_CKPT_WRITE, (size_t)sb.st_size, dt_time_now() - t0);
    }
    if (whole != r->m) dt_gpt2_destroy(whole);
    return st;
}

/* A LoRA run's checkpoint directory also holds PEFT's adapter folder (its two files, the latest step's adapters):
 * PEFT's from_pretrained(DIR) reads it, --resume DIR the checkpoint. Read back from what was just saved, whole. */
static dt_status save_peft(const char *dir) {
    dt_program *t;
    dt_status st = dt_checkpoint_load_adapters(dir, &t);
    if (!st) st = dt_peft_save(dir, t);
    dt_program_destroy(t);
    return st;
}

void dt_train_checkpoint_stage(const run *r, dt_checkpoint_model *cm) {
    int p = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_PP) : 1;
    if (p > 1) cm->stage = dt_mesh_coord(r->mesh, DT_MESH_PP), cm->stages = p, cm->chunks = dt_train_pp_virt(&r->c);
}

/* Weights to FILE.bin / FILE.safetensors, or the full state to a directory;
 * the watchdog waits for it to be whole before it may end the rank. */
dt_status dt_train_save(run *r, int steps_done) {
    const char *path = r->c.save;
    dt_watchdog_hold(r->wd, 1);
    /* a sharded strategy's checkpoint: every rank writes its slices (ZeRO-3's
     * parameters too); a weights file: ZeRO-3's ranks gather their parameters,
     * a model in parts is gathered for rank 0 (collective) */
    bool parts = in_parts(r);
    bool slices = dt_checkpoint_is_dir(path) && (sharded(r) || parts);
    dt_checkpoint_model cm;
    dt_checkpoint_gpt2(r->m, &cm);
    dt_train_checkpoint_stage(r, &cm);
    /* 0/1 Adam's ranks made one (collective); a codec's state (every data-parallel rank's residuals) and a second-order
     * optimizer's, to rank 0 (collective) */
    dt_status st = dt_engine_sync_replicas(r->e);
    if (!st && dt_checkpoint_is_dir(path)) st = dt_checkpoint_gather(r->e, &cm);
    if (!st && !slices) st = dt_engine_materialize(r->e, 1);
    if (st || (r->rank != 0 && !slices && !parts)) {
        /* rank 0 writes what every rank holds */
    } else if (dt_checkpoint_is_dir(path)) {
        dt_checkpoint_position pos = { steps_done, 0, 0, (size_t)r->c.batch * r->c.seq * r->dp_size, dt_train_data_tokens(r) };
        dt_loader_position(r->tl, &pos.epoch, &pos.next);
        st = dt_checkpoint_save(path, parts ? r->w : sharded(r) ? dt_engine_get_config(r->e)->comm : NULL, &r->c, r->nranks, &cm, r->e, &pos);
        if (!st && cm.lora && r->rank == 0) st = save_peft(path);
    } else {
        st = save_weights(r, steps_done);
    }
    dt_checkpoint_release(&cm);
    dt_status back = slices ? DT_OK : dt_engine_materialize(r->e, 0);
    dt_watchdog_hold(r->wd, 0);
    return st ? st : back;
}
