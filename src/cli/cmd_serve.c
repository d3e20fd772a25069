/* dtrain serve: flag parsing only (the server is src/serve/). */
#include "cli.h"
#include "dtrain/serve.h"

#include <stdio.h>
#include <string.h>

static const dt_cli_flag flags[] = {
    { "--port", "a whole number from 0 (any free port) to 65535" }, { "--host", "an address to listen on" },
    { "--lora", "PEFT's adapter folder (or a LoRA run's --save DIR)" },
    { "--threads", "a whole number from 0 (OMP_NUM_THREADS, or the cores it may use) to 1024" }, { "--slots", "a whole number of requests from 1 to 1024" },
    { "--budget", "a whole number of rows a step from 1 to 65536" }, { "--queue", "a whole number of waiting requests from 0 to 1e6" },
    { "--quantize", "int8 (or none)" }, { "--bpe", "ENCODER.json VOCAB.bpe (two files)" }, { "--tokenizer", "a tokenizer.json" },
    { "--max-body", "a size in bytes from 1024 to 1e9" }, { "--upload-timeout", "seconds from 1 to 3600" }, { "--help", "" },
    { "--nproc", "a whole number of local ranks from 1 to 256" }, { "--tp", "a whole number of tensor-parallel ranks from 1 to 256" },
    { "--device", "cpu, cuda or cuda:N" }, { "--context", "a whole number of positions from 1 to 16777216" }, { NULL, NULL },
};

static void usage(void) {
    printf("usage: dtrain serve MODEL [--port 8000] [--host 127.0.0.1] [--threads N] [--slots 8] [--budget 256] [--queue 256]\n"
           "                    [--quantize int8] [--tokenizer tokenizer.json | --bpe ENCODER.json VOCAB.bpe] [--max-body 1048576]\n"
           "                    [--upload-timeout 10] [--lora DIR] [--nproc N --tp N] [--device cuda[:N]] [--context N]\n"
           "--lora DIR: PEFT's LoRA adapter folder (a LoRA run's --save DIR holds one) merged into MODEL.\n"
           "MODEL: a weights file (.bin, .safetensors), an HF folder (its tokenizer.json read where it has one) or a\n"
           "checkpoint directory. OpenAI's completions API:\n"
           "  POST /v1/completions  {\"prompt\", \"max_tokens\" (16), \"temperature\" (1), \"top_p\" (1), \"top_k\" (0: all),\n"
           "                         \"min_p\" (0), \"repetition_penalty\" (1), \"presence_penalty\", \"frequency_penalty\" (0),\n"
           "                         \"logit_bias\", \"seed\" (0), \"n\" (1), \"stop\", \"stream\" (\"stream_options\":\n"
           "                         include_usage), \"echo\", \"logprobs\" (N: each token's and its N likeliest; with echo\n"
           "                         the prompt's too, and max_tokens 0 scores the prompt alone), vLLM's \"ignore_eos\",\n"
           "                         \"min_tokens\", \"stop_token_ids\"}\n"
           "  POST /v1/chat/completions  {\"messages\", ...} by the model's chat template (ChatML; Llama 3, 3.1, 3.2; Qwen 2,\n"
           "                         2.5, 3: its reasoning in reasoning_content; SmolLM2); \"chat_template_kwargs\":\n"
           "                         {\"enable_thinking\": false, \"date_string\": \"26 Jul 2024\"} (Llama 3.2's: today's);\n"
           "                         \"tools\" (Qwen 2.5, 3; Llama 3.1, 3.2): the answer's calls in tool_calls; Llama's tools go in\n"
           "                         the first user message, or its system turn with {\"tools_in_user_message\": false};\n"
           "                         \"logprobs\": true, \"top_logprobs\" (0-20)\n"
           "  GET /health, GET /metrics (Prometheus), GET /v1/models\n"
           "--context N: the positions a request holds, each slot's cache (default: the model's, at most 4096).\n"
           "--slots requests decode together (continuous batching: they join and leave at every step); --budget rows\n"
           "(prompt tokens and one per decoding request) go through the model a step; --queue more wait, beyond that 503.\n"
           "A request's tokens are the same whatever else is in the batch. SIGINT/SIGTERM: finish what is in hand, then exit.\n"
           "--tp N: the model in N tensor-parallel parts, one per rank (--nproc N local ranks, or mpirun's); rank 0 serves.\n"
           "--device cuda[:N]: the decoder on NVIDIA GPU N (0 by default), the weights and the cache there in f32 (one\n"
           "process, not with --tp or --quantize int8).\n");
}

int dt_cli_serve(int argc, char **argv) {
    dt_serve_options o = { .host = "127.0.0.1", .port = 8000, .threads = 0, .slots = 8, .budget = 256, .queue = 256,
                           .max_body = 1 << 20, .upload_seconds = 10 };
    double port = o.port, threads = 0, slots = o.slots, budget = o.budget, queue = o.queue, body = (double)o.max_body,
           upload = o.upload_seconds, nproc = 1, ntp = 0, context = 0;
    bool budget_given = false;
    int named = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(); return 0; }
        if (f[0] != '-' && !o.model) { o.model = f; continue; }
        if (!strcmp(f, "--tokenizer") && v) { o.bpe_encoder = v; o.bpe_vocab = NULL; i++; continue; }
        if (!strcmp(f, "--bpe")) {
            if (i + 2 >= argc) return dt_cli_flag_error("serve", flags, f, NULL);
            o.bpe_encoder = argv[i + 1];
            o.bpe_vocab = argv[i + 2];
            i += 2;
            continue;
        }
        i++;
        if (!strcmp(f, "--port") && dt_cli_number(v, 0, 65535, &port) && port == (int)port) {}
        else if (!strcmp(f, "--host") && v) o.host = v;
        else if (!strcmp(f, "--lora") && v) o.lora = v;
        else if (!strcmp(f, "--threads") && dt_cli_number(v, 0, 1024, &threads) && threads == (int)threads) {}
        else if (!strcmp(f, "--slots") && dt_cli_number(v, 1, 1024, &slots) && slots == (int)slots) {}
        else if (!strcmp(f, "--budget") && dt_cli_number(v, 1, 65536, &budget) && budget == (int)budget) budget_given = true;
        else if (!strcmp(f, "--queue") && dt_cli_number(v, 0, 1e6, &queue) && queue == (int)queue) {}
        else if (!strcmp(f, "--quantize") && v && !dt_quant_parse(v, &o.quant)) {}
        else if (!strcmp(f, "--max-body") && dt_cli_number(v, 1024, 1e9, &body)) {}
        else if (!strcmp(f, "--upload-timeout") && dt_cli_number(v, 1, 3600, &upload)) {}
        else if (!strcmp(f, "--nproc") && dt_cli_number(v, 1, 256, &nproc) && nproc == (int)nproc) {}
        else if (!strcmp(f, "--tp") && dt_cli_number(v, 1, 256, &ntp) && ntp == (int)ntp) {}
        else if (!strcmp(f, "--device") && v && dt_cli_device(v, &o.cuda, &named)) {}
        else if (!strcmp(f, "--context") && dt_cli_number(v, 1, 1 << 24, &context) && context == (int)context) {}
        else return dt_cli_flag_error("serve", flags, f, v);
    }
    if (!o.model) { dt_log(DT_LOG_ERROR, "serve: give the MODEL to serve (a weights file or a checkpoint directory)"); return 2; }
    o.port = (int)port;
    o.threads = (int)threads;
    o.slots = (int)slots;
    o.context = (int)context;
    o.budget = budget_given ? (int)budget : (int)slots > 256 ? (int)slots : 256;
    o.queue = (int)queue;
    o.max_body = (size_t)body;
    o.upload_seconds = upload;
    if (o.budget < o.slots) {
        dt_log(DT_LOG_ERROR, "serve: --budget %d is below --slots %d (each step gives every decoding request a row)", o.budget, o.slots);
        return 2;
    }
    if (o.cuda && (ntp > 1 || nproc > 1 || o.quant != DT_QUANT_NONE)) {
        dt_log(DT_LOG_ERROR, "serve: --device cuda runs the decoder on one GPU in f32 (not with --tp, --nproc or --quantize int8)");
        return 2;
    }
    int launched, rc = dt_cli_join("serve", "one tensor-parallel part per rank (--tp N)", nproc, ntp, argv, &o.comm, &launched);
    if (rc || launched >= 0) return rc ? rc : launched;
    dt_status st = dt_serve_run(&o);
    if (st) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    dt_comm_destroy(o.comm);
    return st ? 1 : 0;
}
