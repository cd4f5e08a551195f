/* dos-train's command line (train_options.h). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "parse.h"
#include "train_options.h"

/* The published shapes (hidden / FFN / layers / heads, sequence 2048, GPT-NeoX vocabulary)
 * keep their sizes; our MLP has two matrices (GELU), so parameter counts are a little
 * below the names. */
static const struct train_preset presets[] = {
	{"tiny", "the PyTorch reference's model", {256, 32, 2, 64, 2, 16}, 4, 1, 4096, 50},
	/* two micro-batches per step: their forward chains run side by side on two cores */
	{"small", "the default: under two minutes on two cores", {256, 192, 6, 768, 6, 128}, 4, 2, 131072, 500},
	{"1b", "about 1 B parameters, for one GPU", {50304, 2048, 16, 8192, 16, 1024}, 1, 1, 100000000, 20},
	{"7b", "hidden 4096, FFN 11008, 32 layers, 32 heads", {50304, 4096, 32, 11008, 32, 2048}, 1, 1, 100000000, 10},
	{"13b", "hidden 5120, FFN 13824, 40 layers, 40 heads", {50304, 5120, 40, 13824, 40, 2048}, 1, 1, 100000000, 10},
	{"20b", "hidden 5120, FFN 20480, 40 layers, 64 heads", {50304, 5120, 64, 20480, 40, 2048}, 1, 1, 100000000, 10},
};
#define DEFAULT_PRESET 1

static void usage(FILE *f)
{
	fprintf(f, "usage: dos-train [options]\n"
		   "Trains the example decoder model (docs/model.md) with the optimizer's updates placed\n"
		   "by a StarPU scheduling policy. No options: the 'small' model, 500 steps, policy dos.\n\n"
		   "model:\n"
		   "  --preset NAME        tiny, small (default), 1b, 7b, 13b, 20b\n"
		   "  --vocab N --hidden N --heads N --ffn N --layers N --seq-len N   override the shape\n"
		   "  --checkpoint-activations   keep only layer inputs; recompute in backward\n"
		   "  --model-on-cpu       forward and backward on CPU workers, GPUs or not (the\n"
		   "                       optimizer's updates still go where the policy puts them);\n"
		   "                       no cuBLAS handles are made. Same results either way\n"
		   "training:\n"
		   "  --steps N            optimizer steps\n"
		   "  --micro-batch N      sequences per micro-batch\n"
		   "  --accumulate N       micro-batches per step (gradient accumulation; per rank in a\n"
		   "                       data-parallel job)\n"
		   "  --seed N             weights and data order (default 1234)\n"
		   "  --data FILE          training text (default: the bundled corpus)\n"
		   "  --eval-every N       loss on held-out text every N steps and after the last\n"
		   "                       (default: a tenth of --steps; 0 = never, the default under\n"
		   "                       10 steps and with --simulate) ...\n"
		   "  --eval-fraction X    ... the last X of the data, never trained on (default 0.1;\n"
		   "                       0: train on all, no evaluation) ...\n"
		   "  --eval-batches N     ... at most N micro-batches of it (default 20)\n"
		   "optimizer (AdamW):\n"
		   "  --lr X --beta1 X --beta2 X --eps X --weight-decay X   (3e-3, 0.9, 0.95, 1e-8, 0.1)\n"
		   "  --warmup N           updates of linear warmup of the learning rate (default: a\n"
		   "                       tenth of --steps)\n"
		   "  --decay-steps N      cosine decay of the learning rate from the end of the\n"
		   "                       warmup to update N (default: --steps; 0 = no decay) ...\n"
		   "  --min-lr-ratio X     ... down to X times --lr (default 0.1); a resumed run\n"
		   "                       needs the interrupted run's --steps (or schedule)\n"
		   "  --precision P        fp32 (default), bf16 or fp16: mixed precision, the model\n"
		   "                       computing on 16-bit weights and activations (fp32 inside\n"
		   "                       kernels, fp32 weight gradients), fp32 optimizer state;\n"
		   "                       fp16 turns dynamic loss scaling on\n"
		   "  --loss-scale X       initial dynamic loss scale (fp16 default 65536; 0 = off)\n"
		   "  --clip X             global gradient-norm clipping (0 = off, default)\n"
		   "  --subgroup-size N    parameters per optimizer subgroup\n"
		   "  --subgroup-layout L  tensors (a subgroup never spans two tensors: an update reads\n"
		   "                       its tensor's gradient in place; the default in one process)\n"
		   "                       or flat (subgroups of --subgroup-size across tensors: the\n"
		   "                       default in a data-parallel job); the same bits either way\n"
		   "  --state-on-host      a fresh run copies its optimizer state in host memory\n"
		   "                       instead of making it by tasks where the policy runs them\n"
		   "                       (the default: state created on a GPU does not cross the\n"
		   "                       link); the same values (a resumed run loads it on the host)\n"
		   "  --state-by-tasks     the default, made explicit (a resumed run still loads it)\n"
		   "scheduling:\n"
		   "  --policy NAME        dos (default), all-cpu, stride, resident, or a StarPU policy\n"
		   "                       (dmda, dmdas, eager, lws, ...); STARPU_SCHED overrides it\n"
		   "output:\n"
		   "  --plot FILE.svg      picture of the last training iteration (phases, updates\n"
		   "                       during backward, workers, links, GPU memory)\n"
		   "  --trace DIR          StarPU FxT trace into DIR (convert with starpu_fxt_tool)\n"
		   "  --simulate NAME      run on a simulated machine of sched/machines/ (h100-pcie5,\n"
		   "                       a100-pcie4, h200): only in the build against StarPU's SimGrid\n"
		   "                       variant (build-simgrid/dos-train); times simulated, no losses\n"
		   "  --dump FILE          write master weights, m, v and working weights (fp32, raw)\n"
		   "checkpoints (optimizer state, step counters, data order; see graph/checkpoint.h):\n"
		   "  --checkpoint-dir DIR save into DIR (made if missing) after the last step; two are\n"
		   "                       kept; DIR belongs to one run, held by one process at a time\n"
		   "  --checkpoint-every N also every N steps\n"
		   "  --resume             continue from DIR's newest checkpoint that verifies, up to\n"
		   "                       --steps in all (without it, DIR must hold no checkpoint)\n"
		   "  --quiet              only the summary\n"
		   "data parallel: started by mpirun or srun, each process is a rank of one job over\n"
		   "StarPU-MPI (each keeps its share of the optimizer state; same result as one process\n"
		   "with the same global batch); DOS_BIND=none keeps the launcher's CPU binding. See the\n"
		   "README's launch guide and docs/data-parallel.md.\n"
		   "  --dp-exchange X      chain (default: gradients summed rank after rank, the same\n"
		   "                       bits as one process; the wait after backward grows with the\n"
		   "                       ranks) or scatter (each rank sums a chunk of every subgroup:\n"
		   "                       a wait that does not grow, bits that depend on the ranks)\n");
}

static int parse_u64(FILE *err, const char *option, const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	if (_dos_parse_u64(text, min, max, out) != 0) {
		fprintf(err, "dos-train: --%s = '%s': expected a whole number in base 10 in [%llu, %llu]\n", option,
			text, (unsigned long long)min, (unsigned long long)max);
		return -EINVAL;
	}
	return 0;
}

static int parse_double(FILE *err, const char *option, const char *text, double *out)
{
	if (_dos_parse_double(text, out) != 0) {
		fprintf(err, "dos-train: --%s = '%s': expected a finite decimal number\n", option, text);
		return -EINVAL;
	}
	return 0;
}

/* Whether the shape's parameter count fits 64 bits. _dos_model_param_count (graph/model.c)
 * counts modulo 2^64: a wrapped count sized dos-train's --dump buffers wrongly, and one
 * wrapped to 0 made the default subgroup size 0, which dos-train divided by. The count of
 * docs/model.md: per layer d (4d + 2F + 2) (two norms, QKV 3d^2, O d^2, the two MLP
 * matrices F d), and d (2V + T + 1) for the embeddings, the final norm and the head. The
 * sizes are below 2^32, so only the products and the last sum can overflow. */
static bool param_count_fits(const struct dos_model_shape *s)
{
	uint64_t d = s->hidden, V = s->vocab, T = s->seq_len, F = s->ffn, L = s->layers;
	uint64_t layer, layers, rest, total;
	return !__builtin_mul_overflow(d, 4 * d + 2 * F + 2, &layer) && !__builtin_mul_overflow(layer, L, &layers) &&
	       !__builtin_mul_overflow(d, 2 * V + T + 1, &rest) && !__builtin_add_overflow(layers, rest, &total);
}

/* _dos_model_param_count's value for a shape whose count fits 64 bits, without its walk
 * over every layer (--layers 4294967295 took 11 s): a layer adds the same count each time
 * (model.h), so the count is that of no layers plus layers times that of one. Both are at
 * most the whole count, so nothing wraps. */
static uint64_t param_count(const struct dos_model_shape *s)
{
	struct dos_model_shape few = *s;
	few.layers = 0;
	uint64_t none = _dos_model_param_count(&few, NULL);
	few.layers = 1;
	uint64_t one = _dos_model_param_count(&few, NULL);
	return none + s->layers * (one - none);
}

/* getopt_long's codes; options[] is indexed by them, so a name follows its code. */
enum {
	O_FIRST = 256,
	O_PRESET = O_FIRST,
	O_VOCAB,
	O_HIDDEN,
	O_HEADS,
	O_FFN,
	O_LAYERS,
	O_SEQ,
	O_CKPT,
	O_STEPS,
	O_MB,
	O_ACC,
	O_SEED,
	O_DATA,
	O_LR,
	O_B1,
	O_B2,
	O_EPS,
	O_WD,
	O_WARMUP,
	O_DECAY,
	O_MIN_LR,
	O_EVAL_EVERY,
	O_EVAL_FRACTION,
	O_EVAL_BATCHES,
	O_PREC,
	O_LS,
	O_CLIP,
	O_SUB,
	O_LAYOUT,
	O_POLICY,
	O_PLOT,
	O_TRACE,
	O_DUMP,
	O_QUIET,
	O_SIMULATE,
	O_CKPT_DIR,
	O_CKPT_EVERY,
	O_RESUME,
	O_STATE_BY_TASKS,
	O_STATE_ON_HOST,
	O_MODEL_ON_CPU,
	O_DP_EXCHANGE,
	O_HELP,
	O_END
};

#define OPTION(code, name, has_arg) [code - O_FIRST] = {name, has_arg, NULL, code}
static const struct option options[] = {
	OPTION(O_PRESET, "preset", 1),
	OPTION(O_VOCAB, "vocab", 1),
	OPTION(O_HIDDEN, "hidden", 1),
	OPTION(O_HEADS, "heads", 1),
	OPTION(O_FFN, "ffn", 1),
	OPTION(O_LAYERS, "layers", 1),
	OPTION(O_SEQ, "seq-len", 1),
	OPTION(O_CKPT, "checkpoint-activations", 0),
	OPTION(O_STEPS, "steps", 1),
	OPTION(O_MB, "micro-batch", 1),
	OPTION(O_ACC, "accumulate", 1),
	OPTION(O_SEED, "seed", 1),
	OPTION(O_DATA, "data", 1),
	OPTION(O_LR, "lr", 1),
	OPTION(O_B1, "beta1", 1),
	OPTION(O_B2, "beta2", 1),
	OPTION(O_EPS, "eps", 1),
	OPTION(O_WD, "weight-decay", 1),
	OPTION(O_WARMUP, "warmup", 1),
	OPTION(O_DECAY, "decay-steps", 1),
	OPTION(O_MIN_LR, "min-lr-ratio", 1),
	OPTION(O_EVAL_EVERY, "eval-every", 1),
	OPTION(O_EVAL_FRACTION, "eval-fraction", 1),
	OPTION(O_EVAL_BATCHES, "eval-batches", 1),
	OPTION(O_PREC, "precision", 1),
	OPTION(O_LS, "loss-scale", 1),
	OPTION(O_CLIP, "clip", 1),
	OPTION(O_SUB, "subgroup-size", 1),
	OPTION(O_LAYOUT, "subgroup-layout", 1),
	OPTION(O_POLICY, "policy", 1),
	OPTION(O_PLOT, "plot", 1),
	OPTION(O_TRACE, "trace", 1),
	OPTION(O_DUMP, "dump", 1),
	OPTION(O_QUIET, "quiet", 0),
	OPTION(O_SIMULATE, "simulate", 1),
	OPTION(O_CKPT_DIR, "checkpoint-dir", 1),
	OPTION(O_CKPT_EVERY, "checkpoint-every", 1),
	OPTION(O_RESUME, "resume", 0),
	OPTION(O_STATE_BY_TASKS, "state-by-tasks", 0),
	OPTION(O_STATE_ON_HOST, "state-on-host", 0),
	OPTION(O_MODEL_ON_CPU, "model-on-cpu", 0),
	OPTION(O_DP_EXCHANGE, "dp-exchange", 1),
	OPTION(O_HELP, "help", 0),
	[O_END - O_FIRST] = {NULL, 0, NULL, 0},
};
#undef OPTION

/* The library's names of the settings the options give, as its messages name them. */
static const struct {
	const char *field, *option;
} option_names[] = {{"hp->lr", "--lr"},
		    {"hp->beta1", "--beta1"},
		    {"hp->beta2", "--beta2"},
		    {"hp->eps", "--eps"},
		    {"hp->weight_decay", "--weight-decay"},
		    {"lr_schedule.decay_steps", "--decay-steps"},
		    {"warmup_steps", "--warmup"},
		    {"lr_schedule.min_ratio", "--min-lr-ratio"},
		    {"clip_norm", "--clip"},
		    {"loss_scale_init", "--loss-scale"},
		    {"subgroup_size", "--subgroup-size"},
		    {"eval_fraction", "--eval-fraction"},
		    {"eval_every", "--eval-every"},
		    {"model_on_cpu", "--model-on-cpu"}};

void dos_train_print_library_error(FILE *err)
{
	const char *message = _dos_last_error_message();
	const size_t names = sizeof option_names / sizeof *option_names;
	/* the line is built whole, then written at once: stderr is unbuffered, and written a
	 * character at a time the lines of a job's ranks interleaved mid-line */
	char line[4096];
	size_t at = (size_t)snprintf(line, sizeof line, "dos-train: ");
	while (*message && at < sizeof line - 2) {
		size_t i = 0;
		while (i < names && strncmp(message, option_names[i].field, strlen(option_names[i].field)))
			i++;
		if (i < names) {
			at += (size_t)snprintf(line + at, sizeof line - 1 - at, "%s", option_names[i].option);
			at = at < sizeof line - 2 ? at : sizeof line - 2;
			message += strlen(option_names[i].field);
		} else {
			line[at++] = *message++;
		}
	}
	line[at++] = '\n';
	line[at] = '\0';
	fputs(line, err);
}

/* The settings the options give, judged by the library's own rules (one home for each:
 * dos_adam_step_init, dos_lr_schedule_check, optimizer.h's and train.h's checks) here,
 * before StarPU starts, and reported under the options' names: the run used to stop only
 * after building the model, naming a field of the library's structs ("clip_norm"). */
static bool library_rules_hold(FILE *err, const struct train_options *o)
{
	const struct dos_train_config *cfg = &o->cfg;
	struct dos_adam_step probe;
	if (dos_adam_step_init(&probe, &cfg->opt.hp, 1, 1.0) == 0 &&
	    dos_lr_schedule_check(&cfg->opt.lr_schedule) == 0 && _dos_clip_norm_check(cfg->opt.clip_norm) == 0 &&
	    _dos_loss_scale_check(cfg->opt.dynamic_loss_scale, cfg->opt.loss_scale_init) == 0 &&
	    _dos_subgroup_size_check(cfg->opt.subgroup_size, o->params) == 0 &&
	    _dos_train_eval_check(cfg->eval_fraction, cfg->eval_every) == 0)
		return true;
	dos_train_print_library_error(err);
	return false;
}

int dos_train_parse_options(int argc, char **argv, struct train_options *out, FILE *err)
{
	*out = (struct train_options){
		.cfg = {.seed = 1234,
			.eval_fraction = 0.1,
			.opt = {.weight_dtype = DOS_FP32,
				.grad_dtype = DOS_FP32,
				.hp = {.mode = DOS_ADAMW,
				       .lr = 3e-3,
				       .beta1 = 0.9,
				       .beta2 = 0.95,
				       .eps = 1e-8,
				       .weight_decay = 0.1},
				.lr_schedule = {.min_ratio = 0.1},
				.loss_scale_window = 1000}},
		.preset = &presets[DEFAULT_PRESET],
		.policy = "dos",
		.precision = "fp32",
	};
	struct dos_train_config *cfg = &out->cfg;
	/* 0: not given (the preset's value); every option's minimum is 1 */
	uint64_t shape_override[6] = {0}, steps = 0, micro_batch = 0, accumulation = 0, subgroup = 0;
	uint64_t warmup = 0, decay_steps = 0, eval_every = 0, eval_batches = 20;
	bool warmup_given = false, decay_given = false, eval_every_given = false;
	double loss_scale = 0;
	bool loss_scale_given = false;

	/* glibc's getopt restarts from scratch (also its permutation state) at optind 0; the
	 * caller may have parsed another command line before */
	optind = 0;
	opterr = err == stderr;
	int c, bad = 0;
	while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
		const char *name = c >= O_FIRST && c < O_END ? options[c - O_FIRST].name : "?";
		switch (c) {
		case O_PRESET: {
			out->preset = NULL;
			for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
				if (!strcmp(optarg, presets[i].name))
					out->preset = &presets[i];
			if (!out->preset) {
				fprintf(err,
					"dos-train: --preset = '%s': unknown; one of tiny, small, 1b, 7b, 13b, 20b\n",
					optarg);
				return TRAIN_OPTIONS_BAD;
			}
			break;
		}
		case O_VOCAB:
		case O_HIDDEN:
		case O_HEADS:
		case O_FFN:
		case O_LAYERS:
		case O_SEQ:
			bad |= parse_u64(err, name, optarg, 1, UINT32_MAX, &shape_override[c - O_VOCAB]) != 0;
			break;
		case O_CKPT:
			cfg->checkpoint_activations = 1;
			break;
		case O_STEPS:
			bad |= parse_u64(err, name, optarg, 1, UINT64_MAX / 2, &steps) != 0;
			break;
		case O_MB:
			bad |= parse_u64(err, name, optarg, 1, 1u << 20, &micro_batch) != 0;
			break;
		case O_ACC:
			bad |= parse_u64(err, name, optarg, 1, 1u << 20, &accumulation) != 0;
			break;
		case O_SEED:
			bad |= parse_u64(err, name, optarg, 0, UINT64_MAX, &cfg->seed) != 0;
			break;
		case O_DATA:
			cfg->data_path = optarg;
			break;
		case O_LR:
			bad |= parse_double(err, name, optarg, &cfg->opt.hp.lr) != 0;
			break;
		case O_B1:
			bad |= parse_double(err, name, optarg, &cfg->opt.hp.beta1) != 0;
			break;
		case O_B2:
			bad |= parse_double(err, name, optarg, &cfg->opt.hp.beta2) != 0;
			break;
		case O_EPS:
			bad |= parse_double(err, name, optarg, &cfg->opt.hp.eps) != 0;
			break;
		case O_WD:
			bad |= parse_double(err, name, optarg, &cfg->opt.hp.weight_decay) != 0;
			break;
		case O_WARMUP:
			warmup_given = true;
			bad |= parse_u64(err, name, optarg, 0, UINT64_MAX / 2, &warmup) != 0;
			break;
		case O_DECAY:
			decay_given = true;
			bad |= parse_u64(err, name, optarg, 0, UINT64_MAX / 2, &decay_steps) != 0;
			break;
		case O_EVAL_EVERY:
			eval_every_given = true;
			bad |= parse_u64(err, name, optarg, 0, UINT64_MAX / 2, &eval_every) != 0;
			break;
		case O_EVAL_FRACTION:
			bad |= parse_double(err, name, optarg, &cfg->eval_fraction) != 0;
			break;
		case O_EVAL_BATCHES:
			bad |= parse_u64(err, name, optarg, 1, UINT32_MAX, &eval_batches) != 0;
			break;
		case O_MIN_LR:
			bad |= parse_double(err, name, optarg, &cfg->opt.lr_schedule.min_ratio) != 0;
			break;
		case O_PREC:
			out->precision = optarg;
			break;
		case O_LS:
			loss_scale_given = true;
			bad |= parse_double(err, name, optarg, &loss_scale) != 0;
			break;
		case O_CLIP:
			bad |= parse_double(err, name, optarg, &cfg->opt.clip_norm) != 0;
			break;
		case O_SUB:
			bad |= parse_u64(err, name, optarg, 1, UINT64_MAX, &subgroup) != 0;
			break;
		case O_LAYOUT:
			if (!strcmp(optarg, "tensors") || !strcmp(optarg, "flat"))
				out->subgroup_layout =
					!strcmp(optarg, "tensors") ? TRAIN_LAYOUT_TENSORS : TRAIN_LAYOUT_FLAT;
			else {
				fprintf(err, "dos-train: --subgroup-layout = '%s': neither tensors nor flat\n", optarg);
				bad = 1;
			}
			break;
		case O_POLICY:
			out->policy = optarg;
			break;
		case O_PLOT:
			out->plot = optarg;
			break;
		case O_TRACE:
			out->trace = optarg;
			break;
		case O_DUMP:
			out->dump = optarg;
			break;
		case O_QUIET:
			out->quiet = 1;
			break;
		case O_CKPT_DIR:
			cfg->checkpoint_dir = optarg;
			break;
		case O_CKPT_EVERY:
			bad |= parse_u64(err, name, optarg, 1, UINT64_MAX / 2, &cfg->checkpoint_every) != 0;
			break;
		case O_RESUME:
			cfg->resume = 1;
			break;
		case O_STATE_BY_TASKS:
			cfg->state_on_host = 0;
			break;
		case O_STATE_ON_HOST:
			cfg->state_on_host = 1;
			break;
		case O_MODEL_ON_CPU:
			cfg->model_on_cpu = 1;
			break;
		case O_SIMULATE:
			/* dos-train's SimGrid build applies it before main (simulate_from_command_line) */
			out->simulate = optarg;
			break;
		case O_DP_EXCHANGE:
			if (!strcmp(optarg, "chain") || !strcmp(optarg, "scatter"))
				cfg->dp.exchange = !strcmp(optarg, "chain") ? DOS_DP_CHAIN : DOS_DP_SCATTER;
			else {
				fprintf(err, "dos-train: --dp-exchange = '%s': neither chain nor scatter\n", optarg);
				bad = 1;
			}
			break;
		case O_HELP:
			usage(stdout);
			return TRAIN_OPTIONS_HELP;
		default: /* '?': getopt_long has said what (on stderr) */
			usage(err);
			return TRAIN_OPTIONS_BAD;
		}
	}
	if (optind < argc) {
		fprintf(err, "dos-train: unexpected argument '%s' (see --help)\n", argv[optind]);
		return TRAIN_OPTIONS_BAD;
	}
	if (!bad && (cfg->resume || cfg->checkpoint_every) && !cfg->checkpoint_dir) {
		fprintf(err, "dos-train: --resume and --checkpoint-every need --checkpoint-dir\n");
		bad = 1;
	}
	if (bad)
		return TRAIN_OPTIONS_BAD;

	const struct train_preset *preset = out->preset;
	cfg->shape = preset->shape;
	uint32_t *fields[] = {&cfg->shape.vocab, &cfg->shape.hidden, &cfg->shape.heads,
			      &cfg->shape.ffn,   &cfg->shape.layers, &cfg->shape.seq_len};
	for (int i = 0; i < 6; i++)
		if (shape_override[i])
			*fields[i] = (uint32_t)shape_override[i];
	if (!param_count_fits(&cfg->shape)) {
		const struct dos_model_shape *s = &cfg->shape;
		fprintf(err,
			"dos-train: the model (V %u, hidden %u, heads %u, FFN %u, layers %u, seq %u) has 2^64 "
			"parameters or more\n",
			s->vocab, s->hidden, s->heads, s->ffn, s->layers, s->seq_len);
		return TRAIN_OPTIONS_BAD;
	}
	cfg->micro_batch = micro_batch ? (uint32_t)micro_batch : preset->micro_batch;
	cfg->accumulation = accumulation ? (uint32_t)accumulation : preset->accumulation;
	cfg->steps = steps ? steps : preset->steps;
	/* the schedule spans the run: counted in updates, it ends a little early when steps
	 * are skipped for overflow, as Megatron's does */
	cfg->opt.lr_schedule.warmup_steps = warmup_given ? warmup : cfg->steps / 10;
	if (!decay_given)
		decay_steps = cfg->steps > cfg->opt.lr_schedule.warmup_steps ? cfg->steps : 0;
	cfg->opt.lr_schedule.decay_steps = decay_steps;
	/* simulated runs compute no losses: evaluating would only add forward passes */
	if (!eval_every_given)
		eval_every = out->simulate || cfg->eval_fraction == 0 ? 0 : cfg->steps / 10;
	cfg->eval_every = eval_every;
	cfg->eval_batches = (uint32_t)eval_batches;
	out->params = param_count(&cfg->shape);
	uint64_t preset_subgroup = preset->subgroup_size < out->params ? preset->subgroup_size : out->params;
	cfg->opt.subgroup_size = subgroup ? subgroup : preset_subgroup;
	if (!strcmp(out->precision, "fp32"))
		cfg->opt.weight_dtype = DOS_FP32;
	else if (!strcmp(out->precision, "bf16"))
		cfg->opt.weight_dtype = DOS_BF16;
	else if (!strcmp(out->precision, "fp16"))
		cfg->opt.weight_dtype = DOS_FP16;
	else {
		fprintf(err, "dos-train: --precision = '%s': one of fp32, bf16, fp16\n", out->precision);
		return TRAIN_OPTIONS_BAD;
	}
	cfg->opt.grad_dtype = cfg->opt.weight_dtype;
	if (!loss_scale_given)
		loss_scale = cfg->opt.weight_dtype == DOS_FP16 ? 65536 : 0;
	/* negative ones too: an explicit --loss-scale -5 does not mean "not given" */
	if (loss_scale < 0 || (loss_scale > 0 && loss_scale < 1)) {
		fprintf(err, "dos-train: --loss-scale = %g: must be 0 (off) or >= 1\n", loss_scale);
		return TRAIN_OPTIONS_BAD;
	}
	cfg->opt.dynamic_loss_scale = loss_scale > 0;
	cfg->opt.loss_scale_init = loss_scale;
	return library_rules_hold(err, out) ? TRAIN_OPTIONS_RUN : TRAIN_OPTIONS_BAD;
}

void dos_train_resolve_layout(struct train_options *o)
{
	struct dos_train_config *cfg = &o->cfg;
	cfg->opt.subgroups_follow_tensors = o->subgroup_layout == TRAIN_LAYOUT_TENSORS ||
					    (o->subgroup_layout == TRAIN_LAYOUT_DEFAULT && _dos_dp_size(&cfg->dp) == 1);
}

void dos_train_warn_options(const struct train_options *o, FILE *err)
{
	const struct dos_train_config *cfg = &o->cfg;
	const struct dos_lr_schedule *s = &cfg->opt.lr_schedule;
	/* the schedule counts updates, at most one per step: the last is update `steps` */
	if (s->warmup_steps > cfg->steps && cfg->opt.hp.lr > 0) {
		double factor = dos_lr_schedule_factor(s, cfg->steps);
		fprintf(err,
			"dos-train: warning: --warmup %llu is more than --steps %llu: the learning rate never "
			"reaches --lr %g, only %g (%g of it) at the last step\n",
			(unsigned long long)s->warmup_steps, (unsigned long long)cfg->steps, cfg->opt.hp.lr,
			cfg->opt.hp.lr * factor, factor);
	}
}
