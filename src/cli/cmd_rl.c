/* dtrain rl: flag parsing and the run's summary only. */
#include "cli.h"
#include "dtrain/kernels.h"
#include "dtrain/rl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dt_cli_flag flags[] = {
    { "--env", "an environment: cartpole, acrobot, mountaincar, pendulum, lunarlander, lunarlander-continuous (or Gymnasium's id), or gym:ID" },
    { "--python", "a Python interpreter that has gymnasium" }, { "--env-workers", "a whole number of processes from 1 to 1024" },
    { "--algo", "ppo, impala or reinforce" }, { "--actors", "a whole number of actor processes from 1 to 256" }, { "--actor-timeout", "seconds from 1 to 1e6" },
    { "--refresh", "a whole number of updates from 1 to 1e6" }, { "--sync", "" }, { "--rho-bar", "a number above 0 and at most 1e6" },
    { "--c-bar", "a number above 0 and at most 1e6" },
    { "--nproc", "a whole number of local ranks from 1 to 256" }, { "--total-steps", "a whole number of env steps from 1 to 1e12" },
    { "--seed", "a whole number from 0 to 1e18" }, { "--envs", "a whole number of environments from 1 to 65536" },
    { "--rollout-steps", "a whole number of steps from 1 to 65536" }, { "--lr", "a number above 0 and at most 1" },
    { "--no-anneal", "" }, { "--gamma", "a number from 0 to 1" }, { "--gae-lambda", "a number from 0 to 1" },
    { "--minibatches", "a whole number from 1 to 65536" }, { "--epochs", "a whole number from 1 to 1000" },
    { "--clip", "a number from 0 to 10" }, { "--ent-coef", "a number from 0 to 10" }, { "--vf-coef", "a number from 0 to 100" },
    { "--max-grad-norm", "a number from 0 (off) to 1e6" }, { "--hidden", "a whole number from 1 to 4096" },
    { "--no-norm-adv", "" }, { "--no-clip-vloss", "" }, { "--norm-obs", "0 or 1" }, { "--trunc-as-term", "" }, { "--norm-reward", "0 or 1" }, { "--print-every", "a whole number of updates from 0 (quiet) to 1e6" },
    { "--metrics", "a file (JSON lines)" }, { "--save", "a .safetensors file" }, { "--report", "a directory" },
    { "--save-every", "a whole number of updates from 1 to 1e9" }, { "--resume", "a run state file (FILE.state, which --save FILE wrote)" },
    { "--threads", "a whole number from 1 to 256" }, { "--async", "a whole number of threads from 1 to 256" },
    { "--async-batch", "a whole number of environments from 1 to 65536" },
    { "--help", "" }, { NULL, NULL },
};

static void usage(void) {
    printf("usage: dtrain rl --env cartpole [--algo ppo|impala|reinforce] [--nproc N] [--total-steps 500000] [--seed 1] [FLAGS]\n"
           "       dtrain rl eval --policy FILE --env cartpole   (see dtrain rl eval --help)\n"
           "Reinforcement learning on dtrain's environments: %s.\n"
           "PPO (CleanRL's ppo.py recipe and defaults): --envs 4 environments in the job, --rollout-steps 128 steps each per\n"
           "rollout, --minibatches 4 x --epochs 4 per update, --lr 2.5e-4 annealed to 0 (--no-anneal), --gamma 0.99,\n"
           "--gae-lambda 0.95, --clip 0.2, --ent-coef 0.01, --vf-coef 0.5, --max-grad-norm 0.5, --hidden 64 (both networks'\n"
           "two layers), advantages normalised per minibatch (--no-norm-adv), the value loss clipped (--no-clip-vloss).\n"
           "Continuous actions (pendulum, lunarlander-continuous): ppo_continuous_action.py's recipe and defaults\n"
           "instead, a Gaussian policy with a learned log std, --envs 1, --rollout-steps 2048, --minibatches 32,\n"
           "--epochs 10, --lr 3e-4, --ent-coef 0, --total-steps 1000000, each environment's observations normalised\n"
           "(--norm-obs 1) and rewards scaled (--norm-reward 1) by running statistics, clipped to +-10; actions clipped\n"
           "to the space as the environment takes them. --norm-obs and --norm-reward apply to discrete runs too (off\n"
           "there by default). LunarLander learns with RL Zoo's settings for it: --envs 16 --rollout-steps 1024\n"
           "--minibatches 256 --epochs 4 --gamma 0.999 --gae-lambda 0.98 --lr 3e-4 --no-anneal --no-clip-vloss\n"
           "(a mean return of 200 in about 1.2M steps).\n"
           "A truncated episode (the time limit) is bootstrapped from its last observation's value; --trunc-as-term\n"
           "treats it as a termination instead, as CleanRL's scripts do under Gymnasium 0.29's same-step autoreset.\n"
           "--nproc N: N local ranks (or the ranks of an mpirun/srun job), each stepping --envs / N environments; the\n"
           "learner is data-parallel over them with the same global batch, so the run is the one process's.\n"
           "--async T: rollouts through an asynchronous pool (EnvPool's send and receive): T threads a rank (an IMPALA\n"
           "actor) step its environments and the policy acts on the first --async-batch B of them to finish (half of them\n"
           "by default) while the others step. Each environment's steps are the synchronous pool's (the policy is fixed\n"
           "during a rollout, an action's draws are the environment's and step's), so the run is the synchronous one's\n"
           "whatever the batches, and so is its run state; built-in environments only.\n"
           "--report DIR: the run's page, DIR/report.html (the mean return and the losses by environment steps, the settings,\n"
           "and a film of the trained policy's greedy episode), beside metrics.jsonl, policy.safetensors (unless --metrics\n"
           "or --save name other files), run.json and film.svg.\n"
           "--print-every 10 updates (0: quiet), --metrics FILE (a JSON line per update: env_steps, mean_return over the\n"
           "last 100 episodes, the losses), --save FILE.safetensors (the actor's and critic's weights, PyTorch's names,\n"
           "and environment 0's observation statistics obs_rms.mean and obs_rms.var when they were normalised),\n"
           "--threads 1 per rank.\n"
           "The run's state goes beside --save FILE as FILE.state (at the end, and every --save-every N updates): the policy,\n"
           "Adam's moments, the last episodes' returns and every environment's state, its running episode and its\n"
           "normalisers; --resume FILE.state with the run's settings (and a --total-steps as large or larger) goes on from it\n"
           "as if the run had not stopped, on any --nproc that divides the environments (metrics appended). IMPALA's holds its\n"
           "actors' environments as the learner last took them and the weights the actors act with: resumed, each actor goes\n"
           "on from there (--sync: bit for bit; asynchronous runs depend on timing anyway). LunarLander's physics world cannot\n"
           "be saved: resumed, each environment's episode restarts (said; not bit for bit); a bridged environment's state\n"
           "cannot be saved.\n"
           "--env gym:ID: any environment gymnasium.make(ID) makes (\"module:ID\" imports module first), run by the bridge in\n"
           "Python workers (--python python3, which must have gymnasium; --env-workers W processes a rank, each holding a\n"
           "share of the rank's environments: one a core by default) that exchange actions, observations and rewards with\n"
           "dtrain through shared memory. A Box observation is flattened, a Discrete one becomes one-hot; the action space\n"
           "is a Discrete or a Box one. A non-finite observation or reward is named and its episode dropped, not the run.\n"
           "--algo impala: the actor-learner (IMPALA, V-trace). --actors 2 processes, each stepping --envs / --actors of the\n"
           "environments with its own copy of the policy, hand rollouts of --rollout-steps 32 to this process, the learner,\n"
           "through shared memory; the learner corrects for their policy lag with V-trace (--rho-bar 1, --c-bar 1), takes\n"
           "--minibatches 4 x --epochs 1 steps a batch (--lr 1e-3 annealed, --envs 16 in all) and publishes its weights every\n"
           "--refresh 1 updates, which the actors take at their next rollout. Asynchronous: an update takes the first rollouts\n"
           "ready; --sync: each actor's next in turn, rollout r acting with the weights of update floor(r / refresh) x refresh,\n"
           "so the run is the same whatever the number of actors. An actor that dies is named and the learner goes on with\n"
           "the others; the actors end with the learner. Actors on other machines: mpirun --enable-recovery -np N+1 dtrain rl\n"
           "--algo impala ...: rank 0 learns, every other rank is one actor (--actors N, the default), messages over MPI; an\n"
           "actor or the learner silent for --actor-timeout 10 seconds counts as gone (Open MPI's messages to a dead rank\n"
           "never fail) and the run goes on without it, or the actors end. Other settings as PPO's (the value loss is not clipped; --clip,\n"
           "--gae-lambda and --no-clip-vloss are PPO's and refused here). The metrics add policy_lag (updates between the weights a rollout acted with and the\n"
           "learner's); approx_kl and clipfrac there are the learner's policy against the actors' and the fraction of\n"
           "importance weights truncated at --rho-bar.\n"
           "--algo reinforce: REINFORCE with a baseline (Sutton and Barto 13.4): --envs 4 x --rollout-steps 512 a rollout; the\n"
           "episodes that began and ended inside it give Monte Carlo returns G (a time limit ends one as a termination does);\n"
           "one step an update on - (G - V) log pi + --vf-coef (V - G)^2 / 2 - --ent-coef H (--lr 1e-2 annealed; the advantages\n"
           "normalised unless --no-norm-adv). Steps of an episode the rollout cut are left out: clipfrac in the metrics is\n"
           "that fraction. Rollouts should be longer than the environment's episodes can be. One process.\n", dt_env_list());
}

/* --python or --env-workers into b; whether v is one. */
static int bridge_flag(const char *f, const char *v, dt_env_bridge_config *b) {
    double w;
    if (!strcmp(f, "--python")) return (b->python = v) != NULL;
    if (!dt_cli_number(v, 1, 1024, &w) || w != (int)w) return 0;
    b->workers = (int)w;
    return 1;
}

static const dt_cli_flag eval_flags[] = {
    { "--policy", "a .safetensors file that dtrain rl --save wrote" }, { "--env", "the environment it was trained on" },
    { "--episodes", "a whole number from 1 to 1e6" }, { "--seed", "a whole number from 0 to 1e18" },
    { "--hidden", "the width it was trained with, 1 to 4096" }, { "--greedy", "" }, { "--film", "an .svg file to write" },
    { "--python", "a Python interpreter that has gymnasium" }, { "--env-workers", "a whole number of processes from 1 to 1024" },
    { "--help", "" }, { NULL, NULL },
};

/* dtrain rl eval --policy FILE --env NAME [--episodes 10] [--seed 1] [--greedy] [--hidden 64] [--film FILE.svg] */
static int eval(int argc, char **argv) {
    const char *policy = NULL, *env = "cartpole", *film = NULL;
    double episodes = 10, seed = 1000, hidden = 64;
    int greedy = 0;
    dt_env_bridge_config bridge = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain rl eval --policy FILE.safetensors --env cartpole [--episodes 10] [--seed 1000] [--greedy] [--hidden 64]\n"
                   "                      [--film FILE.svg]\n"
                   "Plays a policy dtrain rl --save wrote: each episode from reset(seed + k), actions sampled from the policy\n"
                   "(--greedy: the most likely, a Gaussian policy's means; a continuous action clipped to the space); observations\n"
                   "normalised by the statistics saved with the policy when it has them; prints each episode's return and length, and their mean.\n"
                   "--film FILE.svg: the first episode as an animated picture (it plays in a browser, looping, at the environment's\n"
                   "rate), Gymnasium's rendering of each environment drawn as shapes (built-in environments only).\n"
                   "The episodes run side by side; --env gym:ID, --python and --env-workers as for dtrain rl.\n");
            return 0;
        }
        if (!strcmp(f, "--greedy")) { greedy = 1; continue; }
        int ok = v != NULL;
        if (!ok) {}
        else if (!strcmp(f, "--policy")) policy = v;
        else if (!strcmp(f, "--env")) env = v;
        else if (!strcmp(f, "--film")) film = v;
        else if (!strcmp(f, "--python") || !strcmp(f, "--env-workers")) ok = bridge_flag(f, v, &bridge);
        else if (!strcmp(f, "--episodes")) ok = dt_cli_number(v, 1, 1e6, &episodes) && episodes == (int)episodes;
        else if (!strcmp(f, "--seed")) ok = dt_cli_number(v, 0, 1e18, &seed) && seed == (double)(uint64_t)seed;
        else if (!strcmp(f, "--hidden")) ok = dt_cli_number(v, 1, 4096, &hidden) && hidden == (int)hidden;
        else ok = 0;
        if (!ok) return dt_cli_flag_error("rl eval", eval_flags, f, v);
        i++;
    }
    if (!policy) { dt_log(DT_LOG_ERROR, "rl eval: --policy FILE is required (a file dtrain rl --save wrote)"); return 2; }
    int n = (int)episodes, *len = malloc(sizeof(int) * (size_t)n);
    double *ret = malloc(sizeof(double) * (size_t)n), sum = 0;
    dt_rl_eval_config c = { .policy = policy, .env = env, .hidden = (int)hidden, .episodes = n, .seed = (uint64_t)seed,
                             .greedy = greedy, .film = film, .bridge = &bridge };
    /* a policy's few small layers: one thread, as dtrain rl's default (a pool of idle OpenMP workers costs more here) */
    dt_kernels_set_threads(1);
    dt_status st = ret && len ? dt_rl_eval(&c, ret, len) : dt_error(DT_ERR_NOMEM, "rl eval: out of memory");
    for (int k = 0; !st && k < n; k++) {
        printf("episode %d: return %.2f, %d steps\n", k + 1, ret[k], len[k]);
        sum += ret[k];
    }
    if (!st) printf("mean return over %d episodes: %.2f (%s actions)\n", n, sum / n, greedy ? "greedy" : "sampled");
    else dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    if (!st && film) printf("film of episode 1: %s\n", film);
    free(ret);
    free(len);
    return st ? 1 : 0;
}

/* The recipe's defaults for --env's kind of actions (ppo.py's for an environment that cannot be made: the run then
 * refuses it, naming why). A bridged environment is made to learn its spaces. */
static void set_defaults(int argc, char **argv, dt_rl_config *c, dt_env_bridge_config *b) {
    const char *env = NULL;
    const char *algo = "ppo";
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--env")) env = argv[i + 1];
        if (!strcmp(argv[i], "--python")) b->python = argv[i + 1];
        if (!strcmp(argv[i], "--algo")) algo = argv[i + 1];
    }
    dt_env_pool *p = NULL;
    dt_env_bridge_config one = { .python = b->python, .workers = 1 };
    int continuous = env && !dt_env_pool_create(env, 1, 0, 0, &one, &p) && !dt_env_pool_info(p)->actions;
    if (!strcmp(algo, "impala")) dt_impala_defaults(c, continuous);
    else if (!strcmp(algo, "reinforce")) dt_reinforce_defaults(c, continuous);
    else if (continuous) dt_ppo_defaults_continuous(c);
    else dt_ppo_defaults(c);
    if (env) c->env = env;
    c->bridge = b;
    dt_env_pool_destroy(p);
}

/* The settings against the algorithm: 0 where it runs them, else 2 (said). impala_flag, ppo_flag, async_flag: one of
 * IMPALA's flags, of PPO's alone, of the asynchronous pool's, given (NULL: none). */
static int algo_combination(const dt_rl_config *c, double nproc, const char *impala_flag, const char *ppo_flag, const char *async_flag) {
    if (c->algo == DT_RL_REINFORCE && async_flag) {
        dt_log(DT_LOG_ERROR, "rl: %s: PPO's and IMPALA's actors roll out through an asynchronous pool; REINFORCE steps a synchronous one",
               async_flag);
        return 2;
    }
    if (c->async_batch && !c->async_threads) {
        dt_log(DT_LOG_ERROR, "rl: --async-batch %d is the asynchronous pool's: give --async T (its threads)", c->async_batch);
        return 2;
    }
    if (c->save_every && !c->save) {
        dt_log(DT_LOG_ERROR, "rl: --save-every %d saves the run's state beside --save FILE: give --save", c->save_every);
        return 2;
    }
    if (c->algo != DT_RL_IMPALA && impala_flag) {
        dt_log(DT_LOG_ERROR, "rl: %s is IMPALA's (--algo impala)", impala_flag);
        return 2;
    }
    if (c->algo == DT_RL_IMPALA && nproc > 1) {
        dt_log(DT_LOG_ERROR, "rl: --algo impala runs one learner that starts its own actors (--actors N); --nproc is PPO's");
        return 2;
    }
    if (c->algo == DT_RL_REINFORCE && nproc > 1) {
        dt_log(DT_LOG_ERROR, "rl: --algo reinforce runs in one process; --nproc is PPO's");
        return 2;
    }
    if (c->algo != DT_RL_PPO && ppo_flag) { /* settings the other algorithms would ignore */
        dt_log(DT_LOG_ERROR, "rl: %s is PPO's (--algo ppo)", ppo_flag);
        return 2;
    }
    return 0;
}

/* What rl's flags set beside the config: the ranks, threads, the report, and one flag given of IMPALA's, of PPO's alone,
 * of the run state's (NULL: none), for algo_combination's refusals. */
typedef struct {
    int nproc, threads;
    const char *report, *impala_flag, *ppo_flag, *async_flag;
    int actors_given; /* --actors given (under mpirun the ranks decide otherwise) */
} rl_cli;

/* A flag taking a number: 1 taken, 0 a bad number, -1 not one of them. */
static int rl_number(const char *f, const char *v, dt_rl_config *c, rl_cli *x) {
    const dt_cli_num_flag nums[] = {
        { "--actors", 1, 256, 1, &c->actors, 'i' }, { "--refresh", 1, 1e6, 1, &c->refresh, 'i' },
        { "--rho-bar", 1e-12, 1e6, 0, &c->rho_bar, 'f' }, { "--c-bar", 1e-12, 1e6, 0, &c->c_bar, 'f' },
        { "--save-every", 1, 1e9, 1, &c->save_every, 'i' }, { "--nproc", 1, 256, 1, &x->nproc, 'i' },
        { "--total-steps", 1, 1e12, 1, &c->total_steps, 'l' }, { "--seed", 0, 1e18, 1, &c->seed, 'u' },
        { "--envs", 1, 65536, 1, &c->num_envs, 'i' }, { "--rollout-steps", 1, 65536, 1, &c->num_steps, 'i' },
        { "--lr", 1e-12, 1, 0, &c->lr, 'f' }, { "--gamma", 0, 1, 0, &c->gamma, 'f' }, { "--gae-lambda", 0, 1, 0, &c->gae_lambda, 'f' },
        { "--minibatches", 1, 65536, 1, &c->minibatches, 'i' }, { "--epochs", 1, 1000, 1, &c->epochs, 'i' },
        { "--clip", 0, 10, 0, &c->clip_coef, 'f' }, { "--ent-coef", 0, 10, 0, &c->ent_coef, 'f' },
        { "--vf-coef", 0, 100, 0, &c->vf_coef, 'f' }, { "--max-grad-norm", 0, 1e6, 0, &c->max_grad_norm, 'f' },
        { "--hidden", 1, 4096, 1, &c->hidden, 'i' }, { "--print-every", 0, 1e6, 1, &c->print_every, 'i' },
        { "--threads", 1, 256, 1, &x->threads, 'i' }, { "--async", 1, 256, 1, &c->async_threads, 'i' },
        { "--async-batch", 1, 65536, 1, &c->async_batch, 'i' }, { "--actor-timeout", 1, 1e6, 0, &c->actor_timeout, 'd' },
    };
    return dt_cli_number_flag(nums, sizeof nums / sizeof nums[0], f, v);
}

/* A flag taking a word: 1 taken, 0 a bad word, -1 not one of them. */
static int rl_word(const char *f, const char *v, dt_rl_config *c, dt_env_bridge_config *bridge, rl_cli *x) {
    if (!strcmp(f, "--env")) c->env = v;
    else if (!strcmp(f, "--algo")) return !strcmp(v, "ppo") || !strcmp(v, "impala") || !strcmp(v, "reinforce"); /* read by set_defaults */
    else if (!strcmp(f, "--metrics")) c->metrics = v;
    else if (!strcmp(f, "--python") || !strcmp(f, "--env-workers")) return bridge_flag(f, v, bridge);
    else if (!strcmp(f, "--norm-obs")) return (c->norm_obs = !strcmp(v, "1")) || !strcmp(v, "0");
    else if (!strcmp(f, "--norm-reward")) return (c->norm_reward = !strcmp(v, "1")) || !strcmp(v, "0");
    else if (!strcmp(f, "--save")) c->save = v;
    else if (!strcmp(f, "--resume")) c->resume = v;
    else if (!strcmp(f, "--report")) x->report = v;
    else return -1;
    return 1;
}

/* A flag taking no word: 1 taken, -1 not one of them. */
static int rl_switch(const char *f, dt_rl_config *c) {
    if (!strcmp(f, "--no-anneal")) c->anneal_lr = 0;
    else if (!strcmp(f, "--no-norm-adv")) c->norm_adv = 0;
    else if (!strcmp(f, "--no-clip-vloss")) c->clip_vloss = 0;
    else if (!strcmp(f, "--trunc-as-term")) c->trunc_as_term = 1;
    else if (!strcmp(f, "--sync")) c->sync = 1;
    else return -1;
    return 1;
}

/* The flags into c, bridge and x: -1 good, else the exit code (0 after --help). */
static int rl_parse(int argc, char **argv, dt_rl_config *c, dt_env_bridge_config *bridge, rl_cli *x) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(); return 0; }
        if (!strcmp(f, "--no-clip-vloss") || !strcmp(f, "--clip") || !strcmp(f, "--gae-lambda")) x->ppo_flag = f;
        if (!strcmp(f, "--async") || !strcmp(f, "--async-batch")) x->async_flag = f;
        if (!strcmp(f, "--sync") || !strcmp(f, "--actors") || !strcmp(f, "--refresh") || !strcmp(f, "--rho-bar") || !strcmp(f, "--c-bar") ||
            !strcmp(f, "--actor-timeout"))
            x->impala_flag = f;
        x->actors_given |= !strcmp(f, "--actors");
        if (rl_switch(f, c) == 1) continue;
        int r = !v ? 0 : rl_number(f, v, c, x);
        if (r < 0) r = rl_word(f, v, c, bridge, x);
        if (r != 1) return dt_cli_flag_error("rl", flags, f, v);
        i++;
    }
    return -1;
}

/* The run on this rank's share (w NULL: alone), its report and last line from the lead rank. */
static int run_rl(int argc, char **argv, dt_rl_config *c, const rl_cli *x, dt_comm *w, int lead, int ranks) {
    char metrics[4096], policy[4096];
    dt_rl_result r;
    double t0 = dt_time_now();
    /* every rank points its files into the report's directory (only rank 0 writes them) */
    const char *report = x->report;
    dt_status st = report ? dt_rl_report_prepare(report, c, metrics, policy, sizeof metrics) : DT_OK;
    if (!st) st = dt_rl_run(c, w, NULL, NULL, &r);
    if (!st && report && lead) st = dt_rl_report_write(report, c, &r, ranks, argc, argv, dt_time_now() - t0);
    if (st) dt_log(DT_LOG_ERROR, "rl: %s", dt_last_error());
    else if (lead)
        printf("done: %lld env steps in %d updates, %d episodes, mean return of the last 100 %.2f, %.0f env steps/s%s%s%s%s\n",
               (long long)r.env_steps, r.updates, r.episodes, r.mean_return, r.steps_per_s, c->save ? "; saved " : "",
               c->save ? c->save : "", report ? "; report " : "", report ? report : "");
    return st ? 1 : 0;
}

/* IMPALA under mpirun: rank 0 learns, each other rank is an actor, messages that outlive a lost actor (dt_peers) in place
 * of the world, whose watchdog would end every rank at the first death. */
static int impala_job(int argc, char **argv, dt_rl_config *c, const rl_cli *x) {
    dt_peers *p;
    if (dt_peers_create(&p)) { dt_log(DT_LOG_ERROR, "rl: %s", dt_last_error()); return 1; }
    int rank = dt_peers_rank(p), ranks = dt_peers_size(p), given = x->actors_given, rc;
    dt_log_set_rank(ranks > 1 ? rank : -1);
    /* a call into MPI that outlasts the actors' timeout ends its rank: the others name it silent within theirs */
    if (dt_peers_guard(p, dt_rl_actor_timeout(c))) {
        dt_log(DT_LOG_ERROR, "rl: %s", dt_last_error());
        dt_peers_destroy(p);
        return 1;
    }
    if (!given) c->actors = ranks - 1;
    if (ranks < 2 || c->actors != ranks - 1) { /* every rank refuses alike: none waits for another */
        if (rank == 0)
            dt_log(DT_LOG_ERROR, "rl: --algo impala under mpirun: rank 0 learns and every other rank is one actor, so the job "
                   "needs %s%d ranks%s, not %d", given ? "--actors + 1 = " : "", given ? c->actors + 1 : 2, given ? "" : " or more", ranks);
        rc = 2;
    } else if (rank > 0) {
        rc = dt_rl_actor_remote_main(p); /* one thread, as a local actor */
    } else {
        dt_kernels_set_threads(x->threads);
        c->peers = p;
        rc = run_rl(argc, argv, c, x, NULL, 1, 1);
    }
    dt_peers_destroy(p);
    return rc;
}

int dt_cli_rl(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "eval")) return eval(argc - 1, argv + 1);
    if (argc == 3 && !strcmp(argv[1], "actor")) return dt_rl_actor_main(atoi(argv[2])); /* started by the learner */
    dt_rl_config c;
    dt_env_bridge_config bridge = { 0 };
    set_defaults(argc, argv, &c, &bridge);
    rl_cli x = { .nproc = 1, .threads = 1 };
    int rc = rl_parse(argc, argv, &c, &bridge, &x);
    if (rc >= 0) return rc;
    if ((rc = algo_combination(&c, x.nproc, x.impala_flag, x.ppo_flag, x.async_flag))) return rc;
    dt_launch_kind kind;
    if (c.algo == DT_RL_IMPALA && !dt_comm_detect_launch(&kind) && kind == DT_LAUNCH_MPI) return impala_job(argc, argv, &c, &x);
    dt_comm *w;
    int launched;
    rc = dt_cli_join("rl", "", x.nproc, -1, argv, &w, &launched);
    if (rc || launched >= 0) return rc ? rc : launched;
    dt_kernels_set_threads(x.threads);
    rc = run_rl(argc, argv, &c, &x, w, !w || dt_comm_rank(w) == 0, w ? dt_comm_size(w) : 1);
    dt_comm_destroy(w);
    return rc;
}
