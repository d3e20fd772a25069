/* dtrain train [FLAGS]: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/obs.h"
#include "dtrain/train.h"
#include "dtrain/pipeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain train --data FILE [FLAGS]\n"
            "  --model M          preset d6 (default), 124M, 350M, 774M, 1558M (GPT-2), llama-tiny, mixtral-tiny,\n"
            "                     smollm-135m, llama3.2-1b (the Llama family), qwen3-tiny, qwen3-0.6b (Qwen 3),\n"
            "                     qwen3-moe-tiny (Qwen 3's mixture of experts),\n"
            "                     or a model file (llm.c .bin, f32 or bf16; HF GPT-2 .safetensors, f32/bf16/f16),\n"
            "                     or an HF folder (config.json and safetensors: gpt2, llama, qwen2, qwen3, mixtral,\n"
            "                     qwen2_moe, qwen3_moe);\n"
            "                     mlp or mlp:H1,H2,..: image classification (hidden sizes; 256,128 by default) on\n"
            "                     --data DIR with MNIST-style IDX files (default /usr/share/datasets/fashion-mnist),\n"
            "                     --epochs N (5); test accuracy and img/s per worker and in total each epoch\n"
            "                     (--eval-every N: every N steps too, with the seconds trained);\n"
            "                     resnet:small (28x28 images), resnet18, resnet34, resnet50 (torchvision's) on the\n"
            "                     same images, --sync-bn: BatchNorm's statistics over every rank's batch;\n"
            "                     --synthetic: --steps on one random batch (3x224x224; 1x28x28 for resnet:small),\n"
            "                     img/s per iteration as Horovod's synthetic benchmark prints them; --init FILE:\n"
            "                     start from a torchvision state dict in safetensors (weights and running averages);\n"
            "                     a ResNet's --save DIR / --resume DIR / --stop-after count global steps and keep the\n"
            "                     running averages too\n"
            "  --layers/--heads/--channels/--vocab/--max-seq N   shape overrides (any shape); --kv-heads N, --ffn N\n"
            "                     (a Llama's K/V heads and MLP width)\n"
            "  --experts E        a Llama's MLP as E SwiGLU experts (Mixtral's mixture), a GPT-2's as E GELU experts\n"
            "                     (up and down, no biases: gpt2_moe), --ffn hidden units each; --experts-top-k K (2) a\n"
            "                     token, their weights renormalised; dropless\n"
            "  --moe-every N      a mixture in every N-th layer (layers N-1, 2N-1, ..., from 0; Qwen 2 MoE's\n"
            "                     decoder_sparse_step), --first-dense K: the first K layers dense (DeepSeek's\n"
            "                     first_k_dense_replace); the other layers a dense MLP of --dense-ffn F hidden units\n"
            "                     (--ffn's by default)\n"
            "  --moe-aux-loss X   add X times the load-balancing loss (Switch's, as Hugging Face's Mixtral sums it\n"
            "                     over the layers; 0: none, the default): each data-parallel rank's over its own\n"
            "                     micro-batch, as under DDP; a micro-batch held in parts (PP, CP) summed over them\n"
            "  --shared-experts S DeepSeek's mixture: S shared experts of --ffn each (ungated, one MLP of S x --ffn)\n"
            "                     that every token goes through beside its routed ones; dtrain's checkpoints only\n"
            "  --moe-z-loss X     add X times the router z-loss (ST-MoE's: the mean over the layers and tokens of\n"
            "                     the squared log-sum-exp of the router's logits); a softmax router's\n"
            "  --moe-seq-aux-loss X  add X times the sequence-wise balancing loss (DeepSeek-V3's complementary one,\n"
            "                     Megatron's seq_aux_loss; DeepSeek-V3 used 1e-4): each layer's mean over the\n"
            "                     sequences of sum_e f_e P_e, f_e = E / (K T) x the sequence's tokens whose K most\n"
            "                     probable experts hold e, P_e e's mean probability (the sigmoid router's scores\n"
            "                     normalised); either router; the same on every layout\n"
            "  --moe-global-aux-loss X  add X times the global-batch balancing loss (Megatron's global_aux_loss):\n"
            "                     each layer's E sum_e f_e P_e, f_e counted over every data-parallel rank's\n"
            "                     micro-batch of the same index and the step's micro-batches so far; either router\n"
            "  --router R         softmax (Mixtral's, the default) or sigmoid-bias (DeepSeek-V3's: sigmoid scores, a\n"
            "                     bias per expert that only chooses and that each step's load moves by --bias-update\n"
            "                     X (0.001); --expert-groups G, --group-top-k T: a token chooses within its T best of\n"
            "                     G groups; --routed-scale S: the renormalised weights times S)\n"
            "  --capacity-factor F  each expert takes at most F x its even share of a micro-batch's choices on a rank\n"
            "                     (Megatron's), the rest dropped --drop-policy probs (the lightest, the default) or\n"
            "                     position (the latest); without it every choice is computed (dropless)\n"
            "  --data FILE        training tokens (llm.c format), or FILE.jsonl: supervised fine-tuning on chats\n"
            "                     ({\"messages\": [{\"role\", \"content\"}, ..]}) or {\"prompt\", \"completion\"} pairs (texts, or\n"
            "                     lists of messages: the completion's turns scored from where they begin), one\n"
            "                     example a row of --seq (cut or padded), the loss on the assistant's turns or the\n"
            "                     completion only (TRL's SFTTrainer's), the mean over the global batch's scored tokens;\n"
            "                     or {\"prompt\", \"chosen\", \"rejected\"} preference pairs: DPO (TRL's DPOTrainer's losses,\n"
            "                     --dpo-loss; the reference: the starting model, LoRA's base; a pair is two rows of --batch);\n"
            "                     a line's \"tools\" and \"chat_template_kwargs\" (enable_thinking, date_string,\n"
            "                     tools_in_user_message) go to its chat template, as TRL passes a row's\n"
            "  --pack             FILE.jsonl's examples packed into rows of --seq (TRL's packing: best-fit\n"
            "                     decreasing, each example cut at --seq; attention and positions stay in each)\n"
            "  --dpo-beta X       DPO's beta, how far from the reference the policy may go (0.1, TRL's default)\n"
            "  --dpo-loss KINDS   TRL's loss_type, comma-separated to sum them (MPO: sigmoid,bco_pair,sft):\n"
            "                     sigmoid (DPO's, the default), hinge, ipo, exo_pair, nca_pair, robust, bco_pair,\n"
            "                     sppo_hard, apo_zero, apo_down, discopop, sft, sigmoid_norm, aot, aot_unpaired;\n"
            "                     --dpo-loss-weights W,.. (1 each), --dpo-label-smoothing E (robust's flip\n"
            "                     probability, exo_pair's epsilon, aot's), --dpo-discopop-tau T (0.05),\n"
            "                     --dpo-f-divergence reverse_kl|forward_kl|\n"
            "                     js_divergence|alpha_divergence (f-DPO; --dpo-f-alpha A, 0.5); --dpo-ld-alpha A\n"
            "                     (LD-DPO: tokens beyond the pair's shorter completion weighted by A), --dpo-wpo\n"
            "                     (WPO: a pair's loss weighted by its completions' probability under the policy)\n"
            "  --grpo FILE        GRPO (TRL's GRPOTrainer): each step rolls out --grpo-group G (8) completions of the\n"
            "                     next prompts of FILE (.jsonl of {\"prompt\": text} or {\"prompt\": [messages]}, the\n"
            "                     chat template's prompt, with a line's \"tools\" in it; or a prompt a line) with the\n"
            "                     decoder over the weights as they are, scores them by --reward, and trains on them:\n"
            "                     a completion's advantage is its reward less its group's mean over the group's\n"
            "                     standard deviation; --batch x --grad-accum rows a rank a step, whole groups; data\n"
            "                     parallelism only (ddp, zero1, zero2); the prompts in file order, or --shuffle SEED\n"
            "  --reward SPEC      contains:WORD (1 if the completion holds WORD), count:WORD, or cmd:COMMAND: a\n"
            "                     program reading a JSON line {\"prompt\", \"completion\"} a completion and writing\n"
            "                     a number a line (a conversational prompt's messages, the completion as\n"
            "                     [{\"role\": \"assistant\", \"content\"}]: what TRL's reward functions get); given\n"
            "                     again, another function, their rewards summed by --reward-weights W,.. (1 each;\n"
            "                     TRL's reward_funcs and reward_weights), each one's mean in the metrics (reward_1, ..)\n"
            "  --chat-template-kwargs JSON  how conversational prompts are rendered (TRL's chat_template_kwargs):\n"
            "                     {\"enable_thinking\": false} (Qwen 3's empty think block), {\"date_string\": D}\n"
            "                     (Llama 3.1's and 3.2's system turn; by default the template's own date)\n"
            "  --grpo-beta X      the KL penalty to the starting model (0.04, the paper's; 0: no reference kept)\n"
            "  --grpo-kl K        corrected (TRL's default: the k3 estimate times the ratio, DeepSeek-V3.2's unbiased\n"
            "                     gradient) or plain (the k3 estimate alone, the GRPO paper's)\n"
            "  --grpo-loss L      dapo (TRL's default: over the global batch's completion tokens), grpo (each\n"
            "                     completion's mean), dr_grpo (over completions x --completion-tokens), bnpo (over\n"
            "                     the micro-batch's tokens), cispo (the capped ratio times the log-probability, over\n"
            "                     the global batch's tokens; its cap --grpo-epsilon-high, 5 in ScaleRL), sapo (a soft\n"
            "                     gate for the clip, --grpo-sapo-temperature-pos/-neg 1/1.05; as grpo's), luspo (each\n"
            "                     completion's sum, over the completions), vespo (-phi A logp, phi a completion's gamma\n"
            "                     weight of its ratio, over the global batch's tokens; --grpo-vespo K+,L+,K-,L-, 2,3,3,2)\n"
            "  --grpo-epsilon X (0.2)  --grpo-epsilon-high X (the upper side, DAPO's 0.28; X by default)\n"
            "  --grpo-delta X     two-sided clipping: the unclipped ratio capped at X (INTELLECT-2's; none)\n"
            "  --grpo-importance-sampling token|sequence  a ratio a token (TRL's default) or a completion (GSPO)\n"
            "  --grpo-scale-rewards group|batch|none  the advantages over the group's standard deviation (TRL's\n"
            "                     default), the whole global batch's, or not scaled (Dr. GRPO)\n"
            "  --grpo-multi-objective sum_then_normalize|normalize_then_sum  several --reward functions summed\n"
            "                     by weight, then normalized (TRL's default), or each normalized in its group first,\n"
            "                     their sum then over the whole batch (GDPO; TRL's multi_objective_aggregation)\n"
            "  --grpo-mask-truncated  a completion that did not end leaves the loss (DAPO's; TRL's\n"
            "                     mask_truncated_completions)\n"
            "  --grpo-top-entropy-quantile Q  the policy term of only the micro-batch's tokens in the top Q by\n"
            "                     entropy, every rank's together (TRL's top_entropy_quantile; 1, all: off)\n"
            "  --grpo-off-policy-mask D  a completion of negative advantage whose mean log pi_old - log pi is\n"
            "                     above D keeps only its KL term (DeepSeek-V3.2's; TRL's off_policy_mask_threshold)\n"
            "  --grpo-entropy-coef X  the loss less X times the micro-batch's mean entropy over those tokens\n"
            "                     (TRL's entropy_coef: an exploration bonus; 0)\n"
            "  --grpo-adaptive-entropy H[,D[,MIN,MAX]]  the bonus only while the last step's entropy was at most H,\n"
            "                     its coefficient moved by D (0.005) toward it each step within [MIN, MAX] ([0, 1])\n"
            "                     (TRL's use_adaptive_entropy, entropy_target, entropy_coef_delta, _min, _max)\n"
            "  --grpo-iterations N (1: steps a rollout trains, TRL's num_iterations)\n"
            "  --grpo-tools cmd:COMMAND  a completion's tool calls (by the chat template's form; the tools in its\n"
            "                     prompt's line) run by COMMAND (one {\"name\", \"arguments\", \"completion\": its number}\n"
            "                     line a call in, one result line out; {\"error\": ...} a failed call, the metrics'\n"
            "                     tool_failures), their results appended as the template writes them and the\n"
            "                     completion generated on, as TRL's GRPOTrainer(tools=...): the results unscored; the\n"
            "                     reward's completion its answers and results; --grpo-tool-turns N (0: until the row\n"
            "                     is full); proc:COMMAND: one program a rank for the run (its state kept), which\n"
            "                     writes and flushes a result line a call as it reads them\n"
            "  --completion-tokens N  a completion's most tokens (up to the row's end, --seq)\n"
            "  --temperature X (1)  --top-k K (0: all)  --top-p P (1)  --min-p P (0)  --repetition-penalty R (1)\n"
            "                     GRPO's sampling (TRL's, Hugging Face's filters in generate's order); the loss reads\n"
            "                     the model's log-probabilities at the same temperature (TRL's; 0, greedy: at 1)\n"
            "  --tokenizer F      tokenizer.json for FILE.jsonl (the --model folder's by default)\n"
            "  --chat-template T  chatml, llama3, llama3.1, llama3.2, qwen3, qwen2.5, qwen2 or smollm2 (by default the kind\n"
            "                     tokenizer_config.json's is)\n"
            "  --val-data FILE    validation tokens (or FILE.jsonl); --eval-every N steps, --eval-batches N (8)\n"
            "  --batch B (4)  --seq T (64)  --steps N (10; 0: evaluate only, as dtrain eval)  --grad-accum K (1)\n"
            "  --optimizer sgd|adamw|lamb|lars|soap|kfac|shampoo (adamw)  --lr X (3e-4)  --betas B1,B2 (0.9,0.999)\n"
            "  --optimizer soap   SOAP (pytorch_optimizer's): Adam in the eigenbases of each matrix's Shampoo\n"
            "                     statistics, refreshed every --precondition-every N steps (10) by a power iteration\n"
            "                     and QR, sides longer than --precondition-max-dim D (10000) unrotated, vectors plain\n"
            "                     Adam; its first step only measures; --weight-decay decoupled. A preconditioner\n"
            "                     with SGD under it (--grad-clip clips the gradients before it): single, ddp, zero1,\n"
            "                     --pp, --tp (each rank of a group the whole matrices), --ep (a rank's own experts,\n"
            "                     each a matrix, rotated where they are); f32 gradients. Its other matrices shared\n"
            "                     by the data-parallel ranks (each kept by one,\n"
            "                     its directions allgathered; or by groups of --soap-group G of them; 1: every\n"
            "                     rank all)\n"
            "  --optimizer kfac   K-FAC (kfac-pytorch's semantics): each block Linear's gradient preconditioned by its\n"
            "                     Kronecker factors' inverse (the embedding, norms and head as they are; an MLP's\n"
            "                     every Linear, a ResNet's convolutions and head, its BatchNorms as they are), then\n"
            "                     --kfac-base sgd (default) or adamw; single, ddp or zero1, f32 gradients (fp16's\n"
            "                     loss scale divided out of them and of its factors); under --tp each rank\n"
            "                     preconditions the whole Linears (their sides gathered over the group);\n"
            "                     a mixture's experts as they are (with --ep too).\n"
            "                     --kfac-damping D\n"
            "                     (0.001), --kfac-decay F (0.95), --kfac-kl-clip K (0.001; 0 off), --kfac-factor-every N\n"
            "                     and --kfac-inv-every N (1), --kfac-method eigen|inverse (eigen), --kfac-scale\n"
            "                     kfac-pytorch|fisher (kfac-pytorch's factors, or the per-example Fisher's that a\n"
            "                     damping of order 1e-3 is made for: kfac.h), --kfac-workers F:\n"
            "                     KAISA's share of the ranks holding each Linear's decompositions (1: COMM-OPT, the\n"
            "                     default; 1/ranks: MEM-OPT, each rank its own Linears', their gradients sent)\n"
            "  --optimizer shampoo  Shampoo (Meta's distributed_shampoo's semantics): each tensor cut into blocks of at\n"
            "                     most --shampoo-block B (1024) a side after merging its small dimensions; a block's\n"
            "                     filtered gradient (beta1) preconditioned by the inverse 2k-th roots of its k factors\n"
            "                     (running averages at beta2), recomputed every --precondition-every N steps (10) from\n"
            "                     step --shampoo-start S (N; Adam before it) with --shampoo-eps E (1e-12) on their\n"
            "                     diagonals, grafted onto Adam's step size (--eps its epsilon); SGD under it (its\n"
            "                     --momentum, --weight-decay decoupled; --grad-clip clips the gradients before it).\n"
            "                     A mixture's experts each their own blocks (with --ep a rank's own, made where\n"
            "                     they are). Single, ddp or zero1, f32 gradients (under --tp over the whole tensors, gathered):\n"
            "                     the blocks shared by the ranks (or by groups of --shampoo-group G of them; 1: every rank all),\n"
            "                     their directions allgathered in --shampoo-wire fp32|bf16 (fp32)\n"
            "  --eps X (1e-8)  --weight-decay X (0)  --momentum X (0)  --nesterov  --trust-coef X (0.001)\n"
            "  --grad-clip X      clip the global gradient norm (0 = off, the default)\n"
            "  --schedule constant|cosine (constant)  --warmup N (0: linear warm-up with either)  --lr-min X (0)\n"
            "                     (--config gives DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR);\n"
            "                     linear or wsd: Hugging Face's (get_linear_schedule_with_warmup: to --lr-min at\n"
            "                     the end; get_wsd_schedule: warm-up, stable, then the last --decay-steps N (a tenth\n"
            "                     of the run) fall to --lr-min by --decay-type cosine|linear|1-sqrt (cosine)); their\n"
            "                     warm-up starts at 0, as transformers' does\n"
            "  --on-nonfinite stop|skip   a step whose loss or gradient norm is NaN/inf stops the run (default,\n"
            "                     nothing saved) or is skipped (no update; the optimizer then runs after backward)\n"
            "  --shuffle SEED     shuffle batch order (default: file order, as llm.c)\n"
            "  --shuffle-rows     with --shuffle: each of a batch's rows of --seq tokens from anywhere in the file, a new\n"
            "                     draw each pass (as a sampler shuffles examples), not whole batches of B x T in a row\n"
            "  --save DIR         a full-state checkpoint at the end (and on SIGINT/SIGTERM; --save-every N: also every\n"
            "                     N steps): parameters, optimizer state, step, data position, settings, written\n"
            "                     atomically into DIR/step-N (DIR/latest names the newest; older ones are removed)\n"
            "  --keep-last N      keep the newest N checkpoints of --save DIR (1): a resume whose latest is damaged\n"
            "                     goes on from the newest whole one, said (dtrain ckpt verify DIR checks them all)\n"
            "  --save FILE.bin | FILE.safetensors   the weights only: llm.c's format, or HF's layout\n"
            "  --overwrite        --save may replace a checkpoint that another run left in DIR (refused otherwise)\n"
            "  --resume DIR       go on from DIR's latest checkpoint with the settings it stores (data, model, batch,\n"
            "                     optimizer, schedule, --steps; saving into DIR): flags given override them, and a\n"
            "                     change that alters the run is named; a checkpoint of N ranks resumes on any number\n"
            "                     and layout: without --grad-accum the accumulation is set to keep its global batch\n"
            "  --stop-after N     end after N steps of this run, saving as at the end (a run cut into pieces)\n"
            "  --strategy NAME    the parallel strategy: single (one process), ddp (the default over several ranks),\n"
            "                     zero1, zero2, zero3\n"
            "  --zero 1|2|3       ZeRO over the data-parallel ranks (= --strategy zeroN): 1 shards the optimizer state,\n"
            "                     2 the gradients too, 3 the parameters too (gathered unit by unit); every optimizer;\n"
            "                     sharded checkpoints that resume on any layout\n"
            "  --metrics FILE     one JSON line per step (loss, lr, norm, time per phase, tok/s, MFU, I/O)\n"
            "  --tensorboard DIR  TensorBoard's event files in DIR (loss, validation loss, lr, gradient norm, tok/s, MFU,\n"
            "                     bubble, loss scale): tensorboard --logdir DIR\n"
            "  --trace FILE.json  a Chrome trace (Perfetto, chrome://tracing) of --trace-steps A:B (1:10): every rank,\n"
            "                     each unit's forward and backward, collectives, waits, optimizer, data, checkpoints\n"
            "  --report DIR       the run into DIR: metrics.jsonl, run.json, trace.json (steps 2:4 unless --trace)\n"
            "                     and report.html, one self-contained page (see dtrain report)\n"
            "  --threads N        threads per rank for BLAS and OpenMP (0, the default: OMP_NUM_THREADS where it is\n"
            "                     set, else the cores this rank may use (its mask, a container's CPU quota),\n"
            "                     shared with the other ranks on the machine)\n"
            "  --nproc N          data parallelism over N local ranks (1); under mpirun/srun --mpi=pmix the job's\n"
            "                     ranks are used and --nproc is refused\n"
            "  --dp N --tp N --pp N   the mesh: data x tensor x pipeline parallel ranks, whose product is the job's\n"
            "                     ranks (dp: what tp x pp leave). --tp N: each\n"
            "                     rank holds 1/N of every block (Megatron: heads, MLP columns, vocabulary rows;\n"
            "                     N consecutive ranks, one machine's); fp32; --sp: sequence parallelism on the TP\n"
            "                     group (LayerNorms and the residual stream hold 1/N of the rows; --seq divisible by N).\n"
            "                     --pp N: N pipeline stages, each a contiguous run of units balanced by cost (the\n"
            "                     split printed), --grad-accum M (or --micro-batches M) micro-batches of --batch\n"
            "                     per step through them\n"
            "  --ep N             expert parallelism: each group of N consecutive data-parallel ranks splits every\n"
            "                     mixture's experts (rank r of it holds E/N of them) and sends each routed token to\n"
            "                     the rank holding its expert and back (all-to-all); N divides --dp and the experts;\n"
            "                     with --pp (each stage's experts over its data-parallel ranks) and --tp (the\n"
            "                     experts whole on each rank of a group); --strategy ddp, or zero1/2/3 (SGD, AdamW:\n"
            "                     the shared tensors cut over every data-parallel rank, the experts over the ranks\n"
            "                     holding them); not with --cp in this build\n"
            "  --cp N             context parallelism: each sequence split over N ranks (2N chunks, rank r holding\n"
            "                     chunks r and 2N-1-r, so causal attention's work is even); --seq divisible by 2N\n"
            "  --cp-impl I        ring (attention's keys and values passed around the ranks under the compute),\n"
            "                     ulysses (all-to-all: each rank attends over the whole sequence with 1/N of the\n"
            "                     heads; heads divisible by N x --tp) or auto (the default: the one leaving less traffic\n"
            "                     exposed by a cost model; on a CPU all-to-all where the heads split, else ring)\n"
            "  --pp-schedule S    1f1b (default; at most N micro-batches in flight per stage), gpipe (all M\n"
            "                     forwards first) or zb1 (ZB-H1: backward split into B and W, W filling 1f1b's\n"
            "                     bubble; at most N in flight per stage; recomputing, W runs forward again,\n"
            "                     under ZeRO-3 from the block's weights gathered again) or\n"
            "                     interleaved (Megatron's: each stage holds --virtual-stages V chunks (2), the\n"
            "                     micro-batches go through the stages V times; M a multiple of N)\n"
            "  --pp-schedule-print  each stage's list of actions as a table, at start\n"
            "  --pp-wire W        fp32 (default), bf16 or int8: the activations and their gradients between\n"
            "                     stages (bf16: half the bytes, rounded to nearest even; int8: a quarter, one\n"
            "                     absmax scale per token's vector)\n"
            "  --cp-wire W        fp32 (default), bf16 or int8: ring attention's key/value blocks and their\n"
            "                     gradients between context-parallel ranks (int8: a scale per C values), or the\n"
            "                     all-to-all's (ulysses) trades of q, k, v, the output and their gradients (int8: a\n"
            "                     scale per a rank's head channels of a row)\n"
            "  --quiet            no progress output\n"
            "  --print-every N    a progress line every N steps where the output is not a terminal (1; DeepSpeed's\n"
            "                     steps_per_print)\n"
            "  --stall-timeout S  a rank waiting S seconds for a live peer that never joins warns, naming it\n"
            "                     (state, step); at 2 x S the job stops (300; 0 = off). A peer stopped (SIGSTOP,\n"
            "                     Ctrl-Z) for 3 s stops the job at once\n"
            "  --step-at-end      DDP: run the optimizer after backward; by default SGD and AdamW without\n"
            "                     --grad-clip update each bucket inside backward once its allreduce is done\n"
            "  --bucket-mb X      DDP gradient bucket cap in MiB (25; the first bucket is 1 MiB)\n"
            "  --seed N (1337)    initialisation\n"
            "  --lora-rank R      LoRA (PEFT's): rank-R adapters on the targeted Linears train, the rest is frozen;\n"
            "                     only the adapters are in the optimizer, the reductions and the checkpoints\n"
            "  --lora-alpha A     the adapters' scale is A / R (8, PEFT's default)\n"
            "  --lora-targets L   comma-separated module names, PEFT's target_modules (c_attn for GPT-2,\n"
            "                     q_proj,v_proj for Llama and Qwen 2: PEFT's defaults)\n"
            "  --lora-dropout P   drop the adapters' inputs with probability P while training (PEFT's\n"
            "                     lora_dropout; 0, or --lora DIR's own); every layout drops the same values\n"
            "  --lora DIR         start from PEFT's adapter folder DIR (its rank, alpha and targets; a LoRA run's\n"
            "                     --save DIR holds one); with eval, evaluate the model with them\n"
            "  --recompute        activation checkpointing: recompute each block in backward (less memory)\n"
            "  --attention MODE   auto (default: blockwise from T >= 256; with --device cuda, T x T rows while they fit),\n"
            "                     full (keep T x T rows), blockwise (with --device cuda: flash attention, in bf16 or TF32),\n"
            "                     cudnn (--device cuda, --precision bf16: cuDNN's fused attention, loaded from the library path)\n"
            "  --device D         cpu (default), or cuda or cuda:N: the model, its gradients and AdamW on NVIDIA GPU N\n"
            "                     (0), a GPT-2 or Llama family model, f32 or bf16; with --nproc, data parallelism\n"
            "                     (each rank on GPU N, or with plain cuda on its local rank's GPU modulo the GPUs there;\n"
            "                     the gradients averaged through host memory) (docs/gpu.md); the CUDA path is a plugin\n"
            "                     built when nvcc is, loaded only for this\n"
            "  --tf32             with --device cuda: the f32 matmuls in TF32 on the tensor cores (PyTorch's allow_tf32)\n"
            "  --precision P      fp32 (default), bf16 or fp16: mixed precision as torch.autocast (16-bit\n"
            "                     Linears and activations, f32 master weights and optimizer); fp16 scales the\n"
            "                     loss (DeepSpeed's dynamic scaler; the config's fp16 section sets it) and skips\n"
            "                     a step whose gradients overflow (so the optimizer runs after backward, never inside)\n"
            "  --grad-comm P      fp32 (default), bf16 or fp16: the gradients' type in DDP's and ZeRO's reductions:\n"
            "                     half the bytes, summed in f32, the average rounded once (PyTorch DDP's bf16\n"
            "                     compression hook, DeepSpeed's communication_data_type)\n"
            "  --compress C       none (default), powersgd, topk, dgc, onebit or zeroone: DDP's (and but for zeroone ZeRO's) gradients averaged\n"
            "                     compressed, with error feedback (PowerSGD as PyTorch's powerSGD_hook: each matrix at rank R,\n"
            "                     warm-started, vectors and matrices too small to gain sent whole; top-k: each\n"
            "                     bucket's largest entries as (index, value) pairs to every rank; dgc: Deep\n"
            "                     Gradient Compression, top-k with --optimizer sgd's momentum corrected on each\n"
            "                     rank and masked where sent, --grad-clip applied per tensor on each rank at\n"
            "                     clip / sqrt(ranks) before accumulation; onebit: 1-bit Adam, --optimizer adamw for\n"
            "                     --compress-start N steps, then its variance frozen and its momentum averaged as\n"
            "                     signs and a scale by an error-compensated alltoall and allgather; zeroone: 0/1 Adam,\n"
            "                     --optimizer adamw with its variance updated at steps ever further apart up to\n"
            "                     --compress-start N (the gradient averaged whole there, as signs elsewhere), then\n"
            "                     local steps, the ranks' momenta averaged as signs every 1, 2, .. up to\n"
            "                     --compress-local-clip steps; a save or the run's end averages them first); with --pp\n"
            "                     each stage's data-parallel ranks compress their own tensors (a checkpoint keeps\n"
            "                     each stage's state: the same stages and schedule resume it)\n"
            "  --compress-rank R  PowerSGD's rank (default 1)\n"
            "  --compress-density D  top-k, dgc: the share of each bucket's entries a rank sends (default 0.01)\n"
            "  --compress-warmup N  top-k, dgc: N steps at each of the densities 0.25, 0.0625, 0.015625, 0.004\n"
            "                     before D (DGC's warm-up; default 0: none)\n"
            "  --compress-exchange X  top-k, dgc: how the pairs travel: allgather (each rank's to every rank),\n"
            "                     oktopk (Ok-TopK: reduced over balanced regions, then the sums at or above a\n"
            "                     global threshold gathered: O(k) a rank at any rank count), hier (topk: summed\n"
            "                     dense inside each machine, each local rank's slice top-k between machines) or\n"
            "                     auto (default: the cost model's pick per bucket; allgather at 2 ranks)\n"
            "  --compress-refresh N  oktopk: steps between recomputing its regions and global threshold (default 32)\n"
            "  --compress-start N the first N steps averaged whole (default 0; dgc compresses from the first;\n"
            "                     onebit's warm-up of whole Adam steps, 1 or more; zeroone's last step that\n"
            "                     updates the variance, 1 or more)\n"
            "  --compress-var-scaler K  zeroone: the variance's updates at each spacing before it doubles (default 16)\n"
            "  --compress-local-scaler S  zeroone: local steps at each interval before it doubles (default 32678)\n"
            "  --compress-local-clip H  zeroone: the longest interval between the momenta's averages (default 16)\n"
            "  --grad-store P     fp32 (default), or the --precision's type: data parallelism and ZeRO keep the\n"
            "                     averaged gradients in 16 bits until the update (2 bytes per parameter instead of 4,\n"
            "                     ZeRO's 2+2+12 anatomy); they travel in 16 bits and the update waits for backward's end\n"
            "  --config FILE      DeepSpeed-style JSON (train_micro_batch_size_per_gpu, gradient_accumulation_steps,\n"
            "                     optimizer {type, params}, scheduler {type, params}, gradient_clipping, steps,\n"
            "                     zero_optimization.stage, fp16, bf16, data_types.grad_accum_dtype as --grad-store,\n"
            "                     communication_data_type as --grad-comm, steps_per_print as --print-every); \"auto\"\n"
            "                     values keep the flag's value or the default; flags override the file\n");
}

/* Every flag and what it takes: the help's facts for error messages. */
static const dt_cli_flag flags[] = {
    { "--model", "a preset (d6, 124M, 350M, 774M, 1558M), a model file, mlp[:H1,H2,..], resnet:small, resnet18, resnet34 or resnet50" },
    { "--data", "a token file (or, for mlp and resnets, a directory of IDX files)" }, { "--val-data", "a token file" },
    { "--save", "a directory, or FILE.bin / FILE.safetensors" }, { "--init", "a torchvision state dict (FILE.safetensors)" }, { "--resume", "a checkpoint directory" },
    { "--strategy", "single, ddp, zero1, zero2 or zero3" }, { "--zero", "1, 2 or 3" }, { "--metrics", "a file path" }, { "--tensorboard", "a folder" },
    { "--trace", "a file path (FILE.json)" }, { "--trace-steps", "A:B, the first and last step to trace" },
    { "--report", "a directory" }, { "--config", "a JSON file" },
    { "--lora-rank", "a whole number from 1 to 65536" }, { "--lora-alpha", "a number from 1e-6 to 1e6" }, { "--lora-dropout", "a probability from 0 to 0.999" }, { "--dpo-beta", "a number from 1e-6 to 1e6" }, { "--dpo-loss", "sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard, apo_zero, apo_down, discopop, sft, sigmoid_norm, aot or aot_unpaired, comma-separated" }, { "--dpo-loss-weights", "numbers, comma-separated, one a --dpo-loss kind" }, { "--dpo-label-smoothing", "a number from 0 to 0.999" }, { "--dpo-discopop-tau", "a number from 1e-6 to 1e6" }, { "--dpo-f-divergence", "reverse_kl, forward_kl, js_divergence or alpha_divergence" }, { "--dpo-f-alpha", "a number from 1e-6 to 1000" }, { "--dpo-ld-alpha", "a number from 0 to 1" }, { "--dpo-wpo", "" }, { "--grpo", "a prompts file (.jsonl of {\"prompt\": text}, or one a line)" }, { "--reward", "contains:WORD, count:WORD or cmd:COMMAND (once a function, at most 8)" }, { "--reward-weights", "numbers, comma-separated, one a --reward" }, { "--chat-template-kwargs", "a JSON object" }, { "--grpo-loss", "dapo, grpo, dr_grpo, bnpo, cispo, sapo, luspo or vespo" }, { "--grpo-scale-rewards", "group, batch or none" }, { "--grpo-importance-sampling", "token or sequence" }, { "--grpo-epsilon-high", "a number from 1e-6 to 1000" }, { "--grpo-delta", "a number from 1e-6 to 1e6" }, { "--grpo-top-entropy-quantile", "a number from 0 to 1" }, { "--grpo-entropy-coef", "a number from -1000 to 1000" }, { "--grpo-off-policy-mask", "a number from 1e-9 to 1e6" }, { "--grpo-multi-objective", "sum_then_normalize or normalize_then_sum" }, { "--grpo-adaptive-entropy", "a target entropy, then optionally its step (above 0), then a least and a most coefficient (0 <= MIN <= MAX), comma-separated" }, { "--grpo-vespo", "four positive numbers, comma-separated: k and lambda for advantages at or above 0, then below" }, { "--grpo-sapo-temperature-pos", "a number from 1e-6 to 1e6" }, { "--grpo-sapo-temperature-neg", "a number from 1e-6 to 1e6" }, { "--grpo-mask-truncated", "" }, { "--grpo-kl", "corrected or plain" },
    { "--grpo-group", "a whole number from 2 to 4096" }, { "--grpo-iterations", "a whole number from 1 to 1000" }, { "--grpo-tool-turns", "a whole number from 0 to 1000000" }, { "--grpo-tools", "cmd:COMMAND or proc:COMMAND" }, { "--grpo-beta", "a number from 0 to 1e6" }, { "--grpo-epsilon", "a number from 0 to 1e3" },
    { "--completion-tokens", "a whole number from 1 to 1e6" }, { "--temperature", "a number from 0 to 100" }, { "--top-k", "a whole number from 0 (all) to 2^30" }, { "--top-p", "a number above 0 and at most 1" }, { "--min-p", "a number from 0 to 1" }, { "--repetition-penalty", "a number from 0.001 to 1000" },
    { "--lora-targets", "module names, comma-separated (c_attn,c_proj; q_proj,v_proj)" },
    { "--lora", "PEFT's adapter folder (or a LoRA run's --save DIR)" },
    { "--tokenizer", "a tokenizer.json" }, { "--chat-template", "chatml, llama3, llama3.1, llama3.2, qwen3, qwen2.5, qwen2, smollm2 or none" },
    { "--optimizer", "sgd, adamw, lamb, lars, soap, kfac or shampoo" }, { "--shampoo-wire", "fp32 or bf16" },
    { "--shampoo-block", "a whole number from 1 to 1e6" }, { "--shampoo-start", "a whole number of steps from 1 to 1e9" }, { "--shampoo-eps", "a number above 0, at most 1" },
    { "--shampoo-group", "a whole number of ranks from 1, dividing the data-parallel ranks" },
    { "--soap-group", "a whole number of ranks from 1, dividing the data-parallel ranks" }, { "--precondition-every", "a whole number of steps from 1 to 1e6" },
    { "--precondition-max-dim", "a whole number from 1 to 1e6" }, { "--kfac-base", "sgd or adamw" }, { "--kfac-method", "eigen or inverse" }, { "--kfac-scale", "kfac-pytorch or fisher" },
    { "--kfac-damping", "a number above 0, up to 1e6" }, { "--kfac-decay", "a number in [0, 1)" }, { "--kfac-kl-clip", "a number from 0 (off) to 1e6" },
    { "--kfac-factor-every", "a whole number of steps from 1 to 1e6" }, { "--kfac-inv-every", "a whole number of steps from 1 to 1e6" },
    { "--kfac-workers", "a fraction of the data-parallel ranks above 0, at most 1" }, { "--precision", "fp32, bf16 or fp16" }, { "--device", "cpu, cuda or cuda:N" }, { "--grad-comm", "fp32, bf16 or fp16" }, { "--grad-store", "fp32, bf16 or fp16" }, { "--attention", "auto, full or blockwise" },
    { "--schedule", "constant, cosine, linear or wsd" }, { "--decay-type", "cosine, linear or 1-sqrt" },
    { "--decay-steps", "a whole number of steps from 1 to 1e9" }, { "--on-nonfinite", "stop or skip" }, { "--betas", "B1,B2, each in [0, 1)" },
    { "--batch", "a whole number from 1 to 1e6" }, { "--seq", "a whole number from 1 to 1e6" },
    { "--steps", "a whole number from 0 (evaluate only) to 1e9" }, { "--epochs", "a whole number from 1 to 1e6" },
    { "--save-every", "a whole number of steps, 0 (off) to 1e9" }, { "--stop-after", "a whole number of steps, 0 (off) to 1e9" }, { "--grad-accum", "a whole number from 1 to 1e6" }, { "--micro-batches", "a whole number from 1 to 1e6 (--grad-accum)" },
    { "--eval-every", "a whole number of steps, 0 (off) to 1e9" }, { "--keep-last", "a whole number of checkpoints from 1 to 256" }, { "--eval-batches", "a whole number from 1 to 1e6" },
    { "--threads", "a whole number from 0 (this rank's share of its cores) to 1024" },
    { "--nproc", "a whole number of local ranks from 1 to 256" }, { "--dp", "a whole number of ranks from 1 to 65536" },
    { "--tp", "a whole number of ranks from 1 to 65536" }, { "--cp", "a whole number of ranks from 1 to 65536" }, { "--ep", "a whole number of ranks from 1 to 65536" }, { "--cp-impl", "ring, ulysses or auto" }, { "--router", "softmax or sigmoid-bias" }, { "--pp", "a whole number of ranks from 1 to 65536" }, { "--virtual-stages", "a whole number of chunks per stage from 1 to 8" }, { "--pp-schedule", "gpipe, 1f1b, zb1 or interleaved" }, { "--pp-wire", "fp32, bf16 or int8" }, { "--cp-wire", "fp32, bf16 or int8" }, { "--bucket-mb", "a size in MiB above 0, up to 1e6" }, { "--compress", "none, powersgd, topk, dgc, onebit or zeroone" }, { "--compress-rank", "a whole number from 1 to 65536" }, { "--compress-density", "a share above 0, at most 1" }, { "--compress-start", "a whole number of steps from 0 to 1e9" }, { "--compress-warmup", "a whole number of steps from 0 to 1e9" }, { "--compress-exchange", "auto, allgather, oktopk or hier" }, { "--compress-refresh", "a whole number of steps from 1 to 1e9" }, { "--compress-var-scaler", "a whole number from 1 to 1e9" }, { "--compress-local-scaler", "a whole number of steps from 1 to 1e9" }, { "--compress-local-clip", "a whole number of steps from 1 to 1e9" },
    { "--seed", "a whole number from 0 to 1e18" }, { "--shuffle", "a whole-number seed from 1 to 1e18" },
    { "--lr", "a number above 0 and below 10" }, { "--lr-min", "a number from 0 to below 10" },
    { "--warmup", "a whole number of steps from 0 to 1e9" }, { "--grad-clip", "a norm from 0 (off) to 1e9" },
    { "--eps", "a number above 0 and below 1" }, { "--weight-decay", "a number from 0 to below 10" },
    { "--momentum", "a number from 0 to below 1" }, { "--trust-coef", "a number above 0 and at most 1e9" },
    { "--layers", "a whole number from 1 to 1e5" }, { "--heads", "a whole number from 1 to 1e5" },
    { "--channels", "a whole number from 1 to 1e6" }, { "--vocab", "a whole number from 1 to 2^30" },
    { "--max-seq", "a whole number from 1 to 1e7" }, { "--kv-heads", "a whole number from 1 to 1e5" }, { "--ffn", "a whole number from 1 to 1e7" }, { "--experts", "a whole number from 1 to 4096" },
    { "--experts-top-k", "a whole number from 1 to 32" }, { "--moe-aux-loss", "a number from 0 to 1e3" }, { "--moe-z-loss", "a number from 0 to 1e3" }, { "--moe-seq-aux-loss", "a number from 0 to 1e3" }, { "--moe-global-aux-loss", "a number from 0 to 1e3" }, { "--shared-experts", "a whole number from 1 to 64" }, { "--moe-every", "a whole number of layers from 1 to 1e5" }, { "--first-dense", "a whole number of layers from 0 to 1e5" }, { "--dense-ffn", "a whole number from 1 to 1e7" },
    { "--expert-groups", "a whole number from 1 to 4096" }, { "--group-top-k", "a whole number from 1 to 4096" },
    { "--routed-scale", "a number from 1e-6 to 1e3" }, { "--bias-update", "a number from 0 to 1" },
    { "--capacity-factor", "a number above 0, up to 1e3 (without it: dropless)" }, { "--drop-policy", "probs or position" }, { "--stall-timeout", "seconds from 0 (off) to 1e6" }, { "--print-every", "a whole number of steps from 1 to 1e9" },
    { "--nesterov", "" }, { "--quiet", "" }, { "--pack", "" }, { "--overwrite", "" }, { "--recompute", "" }, { "--tf32", "" }, { "--sp", "" }, { "--pp-schedule-print", "" }, { "--step-at-end", "" }, { "--shuffle-rows", "" }, { "--help", "" }, { NULL, NULL },
};

/* A numeric flag: where it goes and its range (whole numbers only where int). */
/* The settings under the flags: a resumed run's own first, then the config file's over them; warnings said once per
 * job. 0, or an exit code (2: said). */
static int base_settings(int argc, char **argv, dt_train_config *c) {
    int rc = 0;
    if (!dt_comm_first_voice()) dt_log_set_level(DT_LOG_ERROR);
    for (int i = 1; i + 1 < argc && !rc; i++)
        if (!strcmp(argv[i], "--resume") && dt_checkpoint_read_settings(argv[i + 1], c)) {
            dt_log(DT_LOG_ERROR, "--resume %s: %s", argv[i + 1], dt_last_error());
            rc = 2;
        }
    int saved_accum = c->grad_accum;
    for (int i = 1; i + 1 < argc && !rc; i++)
        if (!strcmp(argv[i], "--config") && dt_train_config_load(argv[i + 1], c)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            rc = 2;
        }
    /* an accumulation (or DeepSpeed's global batch) given by hand is the run's from here: not kept from the checkpoint */
    if (c->grad_accum != saved_accum || c->train_batch_size) c->resume_batch = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--grad-accum") || !strcmp(argv[i], "--micro-batches")) c->resume_batch = 0;
    dt_log_set_level(DT_LOG_INFO);
    return rc;
}

/* What the flags set beside the config itself (an optimizer's settings are made whole after all of them). */
typedef struct {
    dt_optim_kind kind, kfac_base;
    double betas[2], eps, wd, mom, trust;
    int nesterov, pc_every, pc_max, soap_group;
    int kfac_flags, shampoo_flags, soap_flags; /* --kfac-*, --shampoo-* and --soap-* flags given */
    /* the first flag given of each feature that another flag turns on: a codec's, GRPO's, the pipeline's, context
     * parallelism's, a .jsonl's text, WSD's decay */
    const char *codec_flag, *grpo_flag, *pp_flag, *cp_flag, *text_flag, *decay_flag;
} train_opts;

static void note_family(train_opts *o, const char *f) {
    /* (--reward alone is refused by run_checks.c: a reward program may be meant to run) */
    bool grpo = !strncmp(f, "--grpo-", 7) || !strcmp(f, "--completion-tokens") || !strcmp(f, "--temperature") || !strcmp(f, "--top-k") || !strcmp(f, "--top-p") ||
                !strcmp(f, "--chat-template-kwargs");
    bool pp = !strcmp(f, "--pp-schedule") || !strcmp(f, "--virtual-stages"); /* --pp-wire's and --cp-wire's: run_checks.c */
    bool text = !strcmp(f, "--tokenizer") || !strcmp(f, "--chat-template");
    const char **slot = !strncmp(f, "--compress-", 11) ? &o->codec_flag : grpo ? &o->grpo_flag : pp ? &o->pp_flag
                        : !strcmp(f, "--cp-impl") ? &o->cp_flag : text ? &o->text_flag
                        : !strncmp(f, "--decay-", 8) ? &o->decay_flag : NULL;
    if (slot && !*slot) *slot = f;
}

/* A flag of a feature the run does not use changes nothing: said (by the first rank), as run_checks.c says it of
 * --pp-wire, --cp-wire and --save-every, so a sweep's shared flags still run. */
static void warn_unused(const char *cmd, const dt_train_config *c, const train_opts *o) {
    const struct { const char *flag; bool off; const char *without; } fams[] = {
        { o->codec_flag, c->codec.kind == DT_CODEC_NONE, "a gradient codec (--compress KIND)" },
        { o->grpo_flag, !c->grpo.prompts, "GRPO's prompts (--grpo FILE)" },
        { o->pp_flag, c->pp <= 1, "pipeline stages (--pp)" },
        { o->cp_flag, c->cp <= 1, "context parallelism (--cp)" },
        { o->text_flag, !c->grpo.prompts && !dt_train_is_sft(c->data), "text to read (a .jsonl --data or --grpo's prompts)" },
        { o->decay_flag, c->sched.kind != DT_SCHED_WSD, "a warm-up-stable-decay schedule (--schedule wsd)" },
    };
    for (size_t k = 0; k < sizeof fams / sizeof *fams && dt_comm_first_voice(); k++)
        if (fams[k].flag && fams[k].off) dt_log(DT_LOG_WARN, "%s: %s does nothing without %s", cmd, fams[k].flag, fams[k].without);
}

/* The flags below take a word, f the flag and v its word, and answer 1 taken, 0 a bad word, -1 not theirs, 2 said and
 * exit. This one: a file, a folder or a list, kept as given. */
static int path_flag(const char *f, const char *v, dt_train_config *c) {
    const struct { const char *name; const char **out; } paths[] = {
        { "--model", &c->model }, { "--init", &c->init }, { "--data", &c->data }, { "--val-data", &c->val_data },
        { "--save", &c->save }, { "--resume", &c->resume }, { "--lora-targets", &c->lora.targets }, { "--lora", &c->lora_from },
        { "--tokenizer", &c->tokenizer }, { "--grpo", &c->grpo.prompts }, { "--grpo-tools", &c->grpo.tools },
        { "--chat-template-kwargs", &c->grpo.chat_kwargs },
        { "--metrics", &c->metrics }, { "--tensorboard", &c->tensorboard }, { "--trace", &c->trace }, { "--report", &c->report },
    };
    if (!strcmp(f, "--config")) return 1; /* read above */
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++)
        if (!strcmp(f, paths[k].name)) { *paths[k].out = v; return 1; }
    return -1;
}

/* How the model and its work are split: the strategy, the mesh's implementations and wires, the mixture's routing. */
static int layout_flag(const char *f, const char *v, dt_train_config *c) {
    bool ok = true;
    if (!strcmp(f, "--strategy")) {
        ok = dt_strategy_find(v) != NULL, c->strategy = v;
        if (!ok && !strncasecmp(v, "fsdp", 4)) {
            dt_log(DT_LOG_ERROR, "train: --strategy %s: dtrain's fully sharded data parallelism is zero3 (parameters, gradients "
                   "and optimizer state sharded: FSDP's FULL_SHARD); zero2 is SHARD_GRAD_OP", v);
            return 2;
        }
    } else if (!strcmp(f, "--zero")) {
        static const char *const z[4] = { NULL, "zero1", "zero2", "zero3" };
        ok = strlen(v) == 1 && v[0] >= '1' && v[0] <= '3';
        c->strategy = ok ? z[v[0] - '0'] : NULL;
    } else if (!strcmp(f, "--cp-impl")) {
        ok = !strcmp(v, "ring") || !strcmp(v, "ulysses") || !strcmp(v, "auto");
        c->cp_impl = !strcmp(v, "ring") ? 0 : !strcmp(v, "ulysses") ? 1 : -1;
    } else if (!strcmp(f, "--drop-policy")) {
        ok = !strcmp(v, "probs") || !strcmp(v, "position");
        c->shape.drop_policy = ok && !strcmp(v, "position") ? DT_DROP_POSITION : DT_DROP_PROBS;
    } else if (!strcmp(f, "--router")) {
        ok = !strcmp(v, "softmax") || !strcmp(v, "sigmoid-bias");
        c->shape.router = ok && !strcmp(v, "sigmoid-bias") ? DT_ROUTER_SIGMOID_BIAS : DT_ROUTER_SOFTMAX;
    } else if (!strcmp(f, "--pp-schedule")) ok = (c->pp_schedule = dt_pp_kind_parse(v)) >= 0;
    else if (!strcmp(f, "--pp-wire") || !strcmp(f, "--cp-wire")) {
        dt_pp_wire w;
        if ((ok = !dt_pp_wire_parse(v, &w))) *(!strcmp(f, "--pp-wire") ? &c->pp_wire : &c->cp_wire) = (int)w;
    } else return -1;
    return ok;
}

/* How a step runs: its numbers' types, the device, attention, the schedule, the trace's steps, the data's form. */
static int run_flag(const char *f, const char *v, dt_train_config *c) {
    bool ok = true;
    if (!strcmp(f, "--grpo-loss")) ok = !dt_grpo_loss_parse(v, &c->grpo.loss);
    else if (!strcmp(f, "--grpo-scale-rewards")) ok = !dt_grpo_scale_parse(v, &c->grpo.scale);
    else if (!strcmp(f, "--reward")) { /* once a function, their rewards summed (TRL's reward_funcs) */
        if ((ok = c->grpo.nrewards < DT_GRPO_MAX_REWARDS)) c->grpo.reward[c->grpo.nrewards++] = v;
    } else if (!strcmp(f, "--reward-weights")) ok = (c->grpo.nweights = dt_cli_numbers(v, c->grpo.reward_weight, DT_GRPO_MAX_REWARDS)) > 0;
    else if (!strcmp(f, "--grpo-importance-sampling")) ok = !strcmp(v, "token") || !strcmp(v, "sequence"), c->grpo.sequence = !strcmp(v, "sequence");
    else if (!strcmp(f, "--dpo-loss")) ok = !dt_dpo_losses_parse(v, &c->dpo);
    else if (!strcmp(f, "--dpo-loss-weights")) ok = (c->dpo.nweights = dt_cli_numbers(v, c->dpo.weight, DT_DPO_MAX_LOSSES)) > 0;
    else if (!strcmp(f, "--dpo-f-divergence")) ok = !dt_dpo_divergence_parse(v, &c->dpo);
    else if (!strcmp(f, "--grpo-adaptive-entropy")) { /* H[,DELTA[,MIN,MAX]] */
        double x[4];
        int n = dt_cli_numbers(v, x, 4);
        dt_grpo_config *g = &c->grpo;
        ok = (n == 1 || n == 2 || n == 4) && (n < 2 || x[1] > 0) && (n < 4 || (x[2] >= 0 && x[2] <= x[3]));
        if (ok) g->adaptive = 1, g->ent_target = x[0], g->ent_delta = n > 1 ? x[1] : g->ent_delta;
        if (ok && n == 4) g->ent_min = x[2], g->ent_max = x[3];
    } else if (!strcmp(f, "--grpo-multi-objective")) {
        ok = !strcmp(v, "sum_then_normalize") || !strcmp(v, "normalize_then_sum"), c->grpo.decoupled = !strcmp(v, "normalize_then_sum");
    } else if (!strcmp(f, "--grpo-vespo")) {
        double *k = c->grpo.vespo;
        ok = dt_cli_numbers(v, k, 4) == 4 && k[0] > 0 && k[1] > 0 && k[2] > 0 && k[3] > 0;
    }
    else if (!strcmp(f, "--dpo-ld-alpha")) ok = (c->dpo.ld = dt_cli_number(v, 0, 1, &c->dpo.ld_alpha)) != 0;
    else if (!strcmp(f, "--grpo-kl")) ok = !strcmp(v, "corrected") || !strcmp(v, "plain"), c->grpo.plain_kl = !strcmp(v, "plain");
    else if (!strcmp(f, "--chat-template")) ok = !dt_chat_kind_parse(v, &(dt_chat_kind){ 0 }), c->chat_template = v;
    else if (!strcmp(f, "--trace-steps")) ok = !dt_trace_parse_steps(v, &c->trace_first, &c->trace_last);
    else if (!strcmp(f, "--grad-comm") || !strcmp(f, "--grad-store"))
        ok = !dt_precision_parse(v, !strcmp(f, "--grad-comm") ? &c->grad_comm : &c->grad_store);
    else if (!strcmp(f, "--precision")) ok = !dt_precision_parse(v, &c->precision);
    else if (!strcmp(f, "--device")) ok = dt_cli_device(v, &c->cuda, &c->cuda_named);
    else if (!strcmp(f, "--attention")) {
        ok = !strcmp(v, "auto") || !strcmp(v, "full") || !strcmp(v, "blockwise") || !strcmp(v, "cudnn");
        c->attention = !strcmp(v, "full") ? DT_ATTN_FULL : !strcmp(v, "blockwise") ? DT_ATTN_BLOCKWISE : !strcmp(v, "cudnn") ? DT_ATTN_CUDNN : DT_ATTN_AUTO;
    } else if (!strcmp(f, "--schedule")) {
        ok = !strcmp(v, "constant") || !strcmp(v, "cosine") || !strcmp(v, "linear") || !strcmp(v, "wsd");
        c->sched.kind = !strcmp(v, "cosine") ? DT_SCHED_COSINE : !strcmp(v, "linear") ? DT_SCHED_LINEAR : !strcmp(v, "wsd") ? DT_SCHED_WSD
                        : DT_SCHED_CONSTANT;
    } else if (!strcmp(f, "--decay-type")) {
        ok = !strcmp(v, "cosine") || !strcmp(v, "linear") || !strcmp(v, "1-sqrt");
        c->sched.decay_type = !strcmp(v, "linear") ? DT_DECAY_LINEAR : !strcmp(v, "1-sqrt") ? DT_DECAY_SQRT : DT_DECAY_COSINE;
    } else if (!strcmp(f, "--on-nonfinite")) {
        ok = !strcmp(v, "stop") || !strcmp(v, "skip");
        c->skip_nonfinite = !strcmp(v, "skip");
    } else return -1;
    return ok;
}

/* The optimizer, its preconditioner and the gradients' codec. */
static int optim_flag(const char *f, const char *v, dt_train_config *c, train_opts *o) {
    bool ok = true;
    if (!strcmp(f, "--optimizer") && !strcmp(v, "kfac")) c->kfac_on = 1, c->shampoo_on = 0;
    else if (!strcmp(f, "--optimizer") && !strcmp(v, "shampoo")) c->shampoo_on = 1, c->kfac_on = 0;
    else if (!strcmp(f, "--optimizer")) ok = !dt_optim_parse_kind(v, &o->kind), c->kfac_on = 0, c->shampoo_on = 0;
    else if (!strcmp(f, "--shampoo-wire")) ok = !dt_precision_parse(v, &c->shampoo.wire) && c->shampoo.wire != DT_F16;
    else if (!strcmp(f, "--kfac-base")) ok = !dt_optim_parse_kind(v, &o->kfac_base) && (o->kfac_base == DT_OPT_SGD || o->kfac_base == DT_OPT_ADAMW);
    else if (!strcmp(f, "--kfac-method")) {
        ok = !strcmp(v, "eigen") || !strcmp(v, "inverse");
        c->kfac.method = ok && !strcmp(v, "inverse") ? DT_KFAC_INVERSE : DT_KFAC_EIGEN;
    } else if (!strcmp(f, "--kfac-scale")) {
        ok = !strcmp(v, "kfac-pytorch") || !strcmp(v, "fisher");
        c->kfac.scale = ok && !strcmp(v, "fisher") ? DT_KFAC_SCALE_FISHER : DT_KFAC_SCALE_KFAC_PYTORCH;
    } else if (!strcmp(f, "--compress")) ok = !dt_codec_parse(v, &c->codec.kind);
    else if (!strcmp(f, "--compress-exchange")) ok = !dt_codec_parse_exchange(v, &c->codec.exchange);
    else if (!strcmp(f, "--betas"))
        ok = sscanf(v, "%lf,%lf", &o->betas[0], &o->betas[1]) == 2 && o->betas[0] >= 0 && o->betas[0] < 1 && o->betas[1] >= 0 &&
             o->betas[1] < 1;
    else return -1;
    return ok;
}

static int word_flag(const char *f, const char *v, dt_train_config *c, train_opts *o) {
    int r = path_flag(f, v, c);
    if (r < 0) r = layout_flag(f, v, c);
    if (r < 0) r = run_flag(f, v, c);
    if (r < 0) r = optim_flag(f, v, c, o);
    return r;
}

/* A flag taking a number (f the flag, v its word), within its bounds: 1 taken, 0 a bad number, -1 not one of them. */
static int number_flag(const char *f, const char *v, dt_train_config *c, train_opts *o) {
    const dt_cli_num_flag nums[] = {
        { "--kfac-damping", 1e-30, 1e6, 0, &c->kfac.damping, 'f' }, { "--kfac-decay", 0, 0.999999, 0, &c->kfac.factor_decay, 'f' },
        { "--kfac-kl-clip", 0, 1e6, 0, &c->kfac.kl_clip, 'f' }, { "--kfac-factor-every", 1, 1e6, 1, &c->kfac.factor_every, 'i' },
        { "--kfac-inv-every", 1, 1e6, 1, &c->kfac.inv_every, 'i' }, { "--precondition-every", 1, 1e6, 1, &o->pc_every, 'i' },
        { "--precondition-max-dim", 1, 1e6, 1, &o->pc_max, 'i' }, { "--shampoo-block", 1, 1e6, 1, &c->shampoo.block, 'i' },
        { "--shampoo-start", 1, 1e9, 1, &c->shampoo.start, 'i' }, { "--shampoo-eps", 1e-30, 1, 0, &c->shampoo.eps, 'f' },
        { "--shampoo-group", 1, 65536, 1, &c->shampoo.group, 'i' }, { "--soap-group", 1, 65536, 1, &o->soap_group, 'i' },
        { "--kfac-workers", 1e-9, 1, 0, &c->kfac.workers, 'f' },
        { "--batch", 1, 1e6, 1, &c->batch, 'i' }, { "--seq", 1, 1e6, 1, &c->seq, 'i' }, { "--steps", 0, 1e9, 1, &c->steps, 'i' },
        { "--epochs", 1, 1e6, 1, &c->epochs, 'i' }, { "--save-every", 0, 1e9, 1, &c->save_every, 'i' }, { "--keep-last", 1, 256, 1, &c->keep_last, 'i' },
        { "--stop-after", 0, 1e9, 1, &c->stop_after, 'i' },
        { "--grad-accum", 1, 1e6, 1, &c->grad_accum, 'i' }, { "--micro-batches", 1, 1e6, 1, &c->grad_accum, 'i' }, { "--eval-every", 0, 1e9, 1, &c->eval_every, 'i' },
        { "--eval-batches", 1, 1e6, 1, &c->eval_batches, 'i' }, { "--threads", 0, 1024, 1, &c->threads, 'i' },
        { "--nproc", 1, 256, 1, &c->nproc, 'i' }, { "--dp", 1, 65536, 1, &c->dp, 'i' }, { "--tp", 1, 65536, 1, &c->tp, 'i' }, { "--cp", 1, 65536, 1, &c->cp, 'i' }, { "--ep", 1, 65536, 1, &c->ep, 'i' }, { "--virtual-stages", 1, 8, 1, &c->virtual_stages, 'i' },
        { "--pp", 1, 65536, 1, &c->pp, 'i' }, { "--bucket-mb", 1e-6, 1e6, 0, &c->bucket_mb, 'd' },
        { "--compress-rank", 1, 65536, 1, &c->codec.rank, 'i' }, { "--compress-start", 0, 1e9, 1, &c->codec.start, 'i' },
        { "--compress-density", 1e-9, 1, 0, &c->codec.density, 'f' }, { "--compress-warmup", 0, 1e9, 1, &c->codec.warmup, 'i' },
        { "--compress-refresh", 1, 1e9, 1, &c->codec.refresh, 'i' }, { "--compress-var-scaler", 1, 1e9, 1, &c->codec.var_scaler, 'i' },
        { "--compress-local-scaler", 1, 1e9, 1, &c->codec.local_scaler, 'i' }, { "--compress-local-clip", 1, 1e9, 1, &c->codec.local_clip, 'i' },
        { "--seed", 0, 1e18, 1, &c->seed, 'u' }, { "--shuffle", 1, 1e18, 1, &c->shuffle_seed, 'u' },
        { "--lr", 1e-30, 9.999999, 0, &c->sched.lr, 'f' }, { "--lr-min", 0, 9.999999, 0, &c->sched.lr_min, 'f' },
        { "--warmup", 0, 1e9, 1, &c->sched.warmup, 'i' }, { "--decay-steps", 1, 1e9, 1, &c->sched.decay, 'i' }, { "--grad-clip", 0, 1e9, 0, &c->grad_clip, 'f' },
        { "--eps", 1e-30, 0.999999, 0, &o->eps, 'd' }, { "--weight-decay", 0, 9.999999, 0, &o->wd, 'd' },
        { "--momentum", 0, 0.999999, 0, &o->mom, 'd' }, { "--trust-coef", 1e-30, 1e9, 0, &o->trust, 'd' },
        { "--layers", 1, 1e5, 1, &c->shape.num_layers, 'i' }, { "--heads", 1, 1e5, 1, &c->shape.num_heads, 'i' },
        { "--channels", 1, 1e6, 1, &c->shape.channels, 'i' }, { "--vocab", 1, 1 << 30, 1, &c->shape.vocab_size, 'i' },
        { "--max-seq", 1, 1e7, 1, &c->shape.max_seq_len, 'i' }, { "--kv-heads", 1, 1e5, 1, &c->shape.kv_heads, 'i' },
        { "--ffn", 1, 1e7, 1, &c->shape.ffn, 'i' }, { "--experts", 1, 4096, 1, &c->shape.experts, 'i' },
        { "--experts-top-k", 1, 32, 1, &c->shape.experts_top_k, 'i' }, { "--moe-aux-loss", 0, 1e3, 0, &c->shape.aux_coef, 'f' },
        { "--expert-groups", 1, 4096, 1, &c->shape.expert_groups, 'i' }, { "--group-top-k", 1, 4096, 1, &c->shape.group_top_k, 'i' },
        { "--routed-scale", 1e-6, 1e3, 0, &c->shape.routed_scale, 'f' }, { "--bias-update", 0, 1, 0, &c->shape.bias_rate, 'f' },
        { "--capacity-factor", 1e-6, 1e3, 0, &c->shape.capacity_factor, 'f' }, { "--lora-rank", 1, 65536, 1, &c->lora.rank, 'i' },
        { "--lora-alpha", 1e-6, 1e6, 0, &c->lora.alpha, 'f' }, { "--lora-dropout", 0, 0.999, 0, &c->lora.dropout, 'f' }, { "--dpo-beta", 1e-6, 1e6, 0, &c->dpo.beta, 'd' }, { "--dpo-label-smoothing", 0, 0.999, 0, &c->dpo.label_smoothing, 'd' }, { "--dpo-discopop-tau", 1e-6, 1e6, 0, &c->dpo.discopop_tau, 'd' }, { "--dpo-f-alpha", 1e-6, 1e3, 0, &c->dpo.f_alpha, 'd' }, { "--grpo-group", 2, 4096, 1, &c->grpo.group, 'i' }, { "--grpo-iterations", 1, 1000, 1, &c->grpo.iterations, 'i' }, { "--grpo-tool-turns", 0, 1e6, 1, &c->grpo.tool_turns, 'i' }, { "--grpo-beta", 0, 1e6, 0, &c->grpo.beta, 'd' }, { "--grpo-epsilon", 0, 1e3, 0, &c->grpo.epsilon, 'd' }, { "--grpo-epsilon-high", 1e-6, 1e3, 0, &c->grpo.epsilon_high, 'd' }, { "--grpo-delta", 1e-6, 1e6, 0, &c->grpo.delta, 'd' }, { "--grpo-top-entropy-quantile", 0, 1, 0, &c->grpo.top_entropy, 'd' }, { "--grpo-entropy-coef", -1e3, 1e3, 0, &c->grpo.entropy_coef, 'd' }, { "--grpo-off-policy-mask", 1e-9, 1e6, 0, &c->grpo.off_policy, 'd' }, { "--grpo-sapo-temperature-pos", 1e-6, 1e6, 0, &c->grpo.sapo_pos, 'd' }, { "--grpo-sapo-temperature-neg", 1e-6, 1e6, 0, &c->grpo.sapo_neg, 'd' }, { "--completion-tokens", 1, 1e6, 1, &c->grpo.completion, 'i' }, { "--temperature", 0, 100, 0, &c->grpo.temperature, 'f' }, { "--top-k", 0, 1 << 30, 1, &c->grpo.top_k, 'i' }, { "--top-p", 1e-6, 1, 0, &c->grpo.top_p, 'f' }, { "--min-p", 0, 1, 0, &c->grpo.min_p, 'f' }, { "--repetition-penalty", 1e-3, 1e3, 0, &c->grpo.repetition_penalty, 'f' }, { "--moe-z-loss", 0, 1e3, 0, &c->moe_z_loss, 'f' }, { "--moe-seq-aux-loss", 0, 1e3, 0, &c->moe_seq_aux_loss, 'f' }, { "--moe-global-aux-loss", 0, 1e3, 0, &c->moe_global_aux_loss, 'f' }, { "--shared-experts", 1, 64, 1, &c->shared_experts, 'i' }, { "--moe-every", 1, 1e5, 1, &c->shape.moe_every, 'i' }, { "--first-dense", 0, 1e5, 1, &c->shape.first_dense, 'i' }, { "--dense-ffn", 1, 1e7, 1, &c->shape.dense_ffn, 'i' }, { "--print-every", 1, 1e9, 1, &c->print_every, 'i' }, { "--stall-timeout", 0, 1e6, 0, &c->stall_timeout, 'd' },
    };
    return dt_cli_number_flag(nums, sizeof nums / sizeof nums[0], f, v);
}

/* After the flags: what only makes sense with another flag refused, and the optimizer made whole from its settings
 * (its kind's defaults under them). 0, or 2: said. */
static int settle(const char *cmd, dt_train_config *c, const train_opts *o) {
    if (c->tf32 && !c->cuda) {
        dt_log(DT_LOG_ERROR, "%s: --tf32 is for the GPU's matmuls: it needs --device cuda", cmd);
        return 2;
    }
    if (c->attention == DT_ATTN_CUDNN && (!c->cuda || c->precision != DT_BF16)) {
        dt_log(DT_LOG_ERROR, "%s: --attention cudnn is cuDNN's fused attention on the GPU, in 16 bits: it needs --device cuda and "
               "--precision bf16", cmd);
        return 2;
    }
    if (c->shuffle_rows && !c->shuffle_seed) {
        dt_log(DT_LOG_ERROR, "%s: --shuffle-rows says how --shuffle SEED shuffles (row by row, not batch by batch); give a seed", cmd);
        return 2;
    }
    if (o->kfac_flags && !c->kfac_on) {
        dt_log(DT_LOG_ERROR, "%s: --kfac-* flags set K-FAC's preconditioning, which is --optimizer kfac (not given)", cmd);
        return 2;
    }
    if (o->shampoo_flags && !c->shampoo_on) {
        dt_log(DT_LOG_ERROR, "%s: --shampoo-* flags set Shampoo's preconditioning, which is --optimizer shampoo (not given)", cmd);
        return 2;
    }
    if (o->soap_flags && (o->kind != DT_OPT_SOAP || c->kfac_on || c->shampoo_on)) {
        dt_log(DT_LOG_ERROR, "%s: --soap-group shares SOAP's matrices out, which is --optimizer soap (not given)", cmd);
        return 2;
    }
    dt_optim_defaults(c->kfac_on ? o->kfac_base : c->shampoo_on ? DT_OPT_SGD : o->kind, &c->opt);
    c->opt.beta1 = (float)o->betas[0];
    c->opt.beta2 = (float)o->betas[1];
    c->opt.eps = (float)o->eps;
    c->opt.weight_decay = (float)o->wd;
    c->opt.momentum = (float)o->mom;
    c->opt.nesterov = o->nesterov;
    c->opt.trust_coef = (float)o->trust;
    c->opt.precond_every = o->pc_every;
    c->opt.precond_max_dim = o->pc_max;
    c->opt.soap_group = o->soap_group;
    c->shampoo.beta1 = c->opt.beta1, c->shampoo.beta2 = c->opt.beta2, c->shampoo.graft_eps = c->opt.eps, c->shampoo.every = o->pc_every;
    return 0;
}

int dt_cli_train_parse(int argc, char **argv, const char *cmd, dt_train_config *out) {
    dt_train_config c;
    dt_train_defaults(&c);
    int rc0 = base_settings(argc, argv, &c);
    if (rc0) return rc0;
    /* a resumed K-FAC run's base, or SGD */
    train_opts o = { .kind = c.opt.kind, .kfac_base = c.kfac_on ? c.opt.kind : DT_OPT_SGD, .betas = { c.opt.beta1, c.opt.beta2 },
                     .eps = c.opt.eps, .wd = c.opt.weight_decay, .mom = c.opt.momentum, .trust = c.opt.trust_coef,
                     .nesterov = c.opt.nesterov, .pc_every = c.opt.precond_every, .pc_max = c.opt.precond_max_dim,
                     .soap_group = c.opt.soap_group };
    /* the flags that take no word */
    const struct { const char *name; int *on; } switches[] = {
        { "--nesterov", &o.nesterov }, { "--quiet", &c.quiet }, { "--overwrite", &c.overwrite }, { "--recompute", &c.recompute },
        { "--tf32", &c.tf32 }, { "--sp", &c.sp }, { "--pack", &c.pack }, { "--pp-schedule-print", &c.pp_print },
        { "--step-at-end", &c.step_at_end }, { "--sync-bn", &c.sync_bn }, { "--synthetic", &c.synthetic },
        { "--shuffle-rows", &c.shuffle_rows }, { "--grpo-mask-truncated", &c.grpo.mask_truncated }, { "--dpo-wpo", &c.dpo.wpo },
    };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return 0; }
        size_t sw = 0;
        while (sw < sizeof switches / sizeof *switches && strcmp(f, switches[sw].name)) sw++;
        if (sw < sizeof switches / sizeof *switches) {
            *switches[sw].on = 1;
            note_family(&o, f);
            continue;
        }
        i++;
        o.kfac_flags += !strncmp(f, "--kfac-", 7);
        o.shampoo_flags += !strncmp(f, "--shampoo-", 10);
        o.soap_flags += !strncmp(f, "--soap-", 7);
        note_family(&o, f);
        int r = !v ? 0 : number_flag(f, v, &c, &o);
        if (r < 0) r = word_flag(f, v, &c, &o);
        if (r == 2) return 2;
        if (r != 1) return dt_cli_flag_error(cmd, flags, f, v);
    }
    int rc = settle(cmd, &c, &o);
    if (rc) return rc;
    /* (the planner prices layouts and codecs it may choose itself) */
    if (!strcmp(cmd, "train")) warn_unused(cmd, &c, &o);
    *out = c;
    return -1;
}

int dt_cli_train(int argc, char **argv) {
    dt_train_config c;
    int rc = dt_cli_train_parse(argc, argv, "train", &c);
    if (rc >= 0) return rc;
    /* the whole command line ("dtrain train ..."), re-run once per rank by --nproc */
    c.argc = argc + 1;
    c.argv = argv - 1;
    return dt_train_run(&c);
}
