/* dtrain ckpt info|verify|export|merge: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain ckpt info [--verify] DIR           what DIR's latest checkpoint (or DIR/step-N) holds: step,\n"
               "                                                 layout (the strategy and ranks that saved it, each rank's\n"
               "                                                 piece), tensors; --verify: and ckpt verify DIR\n"
               "       dtrain ckpt verify DIR                    every file of each checkpoint DIR keeps (--keep-last) against\n"
               "                                                 its manifest's sizes and hashes; exit 1 if any is damaged\n"
               "       dtrain ckpt export MODEL OUT [--tokenizer F]  the weights of a checkpoint DIR (or of a weights file or an\n"
               "                                                 HF folder: a conversion) as OUT.safetensors (HF names), OUT.bin\n"
               "                                                 (llm.c's), or a folder OUT/ with config.json and\n"
               "                                                 model.safetensors that from_pretrained loads (GPT-2, Llama,\n"
               "                                                 Qwen 2), or OUT.gguf for llama.cpp (f32). The tokenizer:\n"
               "                                                 --tokenizer tokenizer.json or MODEL's own; a folder gets its\n"
               "                                                 files (tokenizer.json, and beside it tokenizer_config.json,\n"
               "                                                 special_tokens_map.json, generation_config.json), a GGUF its\n"
               "                                                 vocabulary, chat template and end-of-text (without one: the\n"
               "                                                 256 bytes then placeholders, token ids meaning the same)\n"
               "       dtrain ckpt merge MODEL ADAPTERS OUT [--tokenizer F]  MODEL with PEFT's LoRA adapters (the folder\n"
               "                                                 ADAPTERS, or a LoRA run's --save DIR) merged into it, W +\n"
               "                                                 (alpha/r) B A as PEFT's merge_and_unload, written as export\n"
               "                                                 writes OUT\n");
}

/* What export writes, from OUT's name: 's' safetensors, 'b' llm.c, 'g' GGUF, 'd' an HF folder, 0 refused. */
static char export_kind(const char *out) {
    size_t n = strlen(out);
    if (n > 4 && !strcmp(out + n - 4, ".bin")) return 'b';
    if (dt_safetensors_path(out)) return 's';
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) return 'g';
    const char *base = strrchr(out, '/');
    base = base ? base + 1 : out;
    /* "OUT/", "OUT" or an existing directory: a folder; "out.pt" and the like: refused */
    return !*base || !strrchr(base, '.') || dt_checkpoint_check_path(out, "ckpt export") == DT_OK ? 'd' : 0;
}

/* export and merge: MODEL's weights (with adapters merged when lora is given) written as OUT's name says. */
static int export_model(const char *model, const char *lora, const char *out, const char *tok_flag) {
    const char *cmd = lora ? "ckpt merge" : "ckpt export";
    char kind = export_kind(out);
    if (!kind) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 2; }
    if (tok_flag && kind != 'g' && kind != 'd') {
        dt_log(DT_LOG_ERROR, "%s: --tokenizer goes into a GGUF (OUT.gguf) or beside a folder's weights; %s is neither", cmd, out);
        return 2;
    }
    dt_gpt2 *m;
    int step;
    /* a checkpoint's weights, or a weights file's or an HF folder's (export converts between the formats) */
    if (dt_checkpoint_load_weights(model, 0, &m, &step)) { dt_log(DT_LOG_ERROR, "%s: %s", cmd, dt_last_error()); return 1; }
    if (lora && dt_peft_merge(lora, dt_gpt2_program(m))) {
        dt_log(DT_LOG_ERROR, "%s: %s", cmd, dt_last_error());
        dt_gpt2_destroy(m);
        return 1;
    }
    /* a GGUF's vocabulary, chat template and end-of-text, and a folder's tokenizer files: --tokenizer's (and its
     * folder's tokenizer_config.json), or the model folder's own */
    dt_bpe *tok = NULL;
    char found[4200], *jinja = NULL;
    int eos = -1;
    struct stat sb;
    snprintf(found, sizeof found, "%s/tokenizer.json", model);
    const char *tpath = tok_flag ? tok_flag : (kind == 'g' || kind == 'd') && stat(found, &sb) == 0 ? found : NULL;
    dt_status st = tpath ? dt_bpe_load_json(tpath, &tok) : DT_OK;
    if (!st && tok && kind == 'g') st = dt_tokenizer_config_read(tpath, tok, NULL, &eos, &jinja);
    if (!st) st = kind == 'b' ? dt_llmc_save(out, m) : kind == 's' ? dt_safetensors_save(out, m, DT_F32)
                   : kind == 'g' ? dt_gguf_save(out, m, tok ? &(dt_gguf_vocab){ tok, jinja, eos } : NULL) : dt_hf_folder_save(out, m);
    if (!st && kind == 'd' && tpath) st = dt_hf_tokenizer_copy(tpath, out);
    dt_bpe_destroy(tok);
    free(jinja);
    dt_gpt2_destroy(m);
    if (st) { dt_log(DT_LOG_ERROR, "%s: %s", cmd, dt_last_error()); return 1; }
    const char *what = kind == 'd' && tpath ? " (config.json, model.safetensors and the tokenizer's files)"
                       : kind == 'd' ? " (config.json, model.safetensors)" : "";
    if (lora) printf("wrote %s%s (%s with %s merged)\n", out, what, model, lora);
    else if (step >= 0) printf("wrote %s%s (step %d of %s)\n", out, what, step, model);
    else printf("wrote %s%s (from %s)\n", out, what, model);
    return 0;
}

int dt_cli_ckpt(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
    bool verify = argc == 4 && !strcmp(argv[1], "info") && !strcmp(argv[2], "--verify");
    if ((argc == 3 || verify) && !strcmp(argv[1], "info")) {
        const char *dir = argv[argc - 1];
        if (dt_checkpoint_describe(dir, stdout)) { dt_log(DT_LOG_ERROR, "ckpt info: %s", dt_last_error()); return 1; }
        if (verify && dt_checkpoint_verify(dir, stdout)) { dt_log(DT_LOG_ERROR, "ckpt info --verify: %s", dt_last_error()); return 1; }
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "verify")) {
        if (dt_checkpoint_verify(argv[2], stdout)) { dt_log(DT_LOG_ERROR, "ckpt verify: %s", dt_last_error()); return 1; }
        return 0;
    }
    bool tok_flag = argc == 6 && !strcmp(argv[4], "--tokenizer");
    if ((argc == 4 || tok_flag) && !strcmp(argv[1], "export")) return export_model(argv[2], NULL, argv[3], tok_flag ? argv[5] : NULL);
    bool merge_tok = argc == 7 && !strcmp(argv[5], "--tokenizer");
    if ((argc == 5 || merge_tok) && !strcmp(argv[1], "merge")) return export_model(argv[2], argv[3], argv[4], merge_tok ? argv[6] : NULL);
    usage(stderr);
    dt_log(DT_LOG_ERROR, "ckpt: expected info [--verify] DIR, verify DIR, export MODEL OUT [--tokenizer tokenizer.json] or merge MODEL "
                         "ADAPTERS OUT [--tokenizer tokenizer.json]");
    return 2;
}
