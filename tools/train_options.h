/* dos-train's command line: the options, their validation and the preset, shape,
 * precision and loss-scale resolution, apart from anything that needs StarPU or the file
 * system (the default --data path, the build's --simulate and --trace support, the
 * policy's name), which stay in dos_train.c. Apart so that tests/fuzz/fuzz_options.c can
 * run it on its own. */
#ifndef DOS_TRAIN_OPTIONS_H
#define DOS_TRAIN_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "train.h"

/* A model size with its training defaults (--preset). */
struct train_preset {
	const char *name, *what;
	struct dos_model_shape shape;
	uint32_t micro_batch, accumulation;
	uint64_t subgroup_size, steps;
};

/* Everything the command line decides. The strings point into argv (or are constants). */
struct train_options {
	/* shape, micro_batch, accumulation, steps, seed, checkpoint_activations, data_path
	 * (NULL when --data is not given), opt (subgroup size, dtypes, AdamW, clipping, loss
	 * scale), checkpoint_dir, checkpoint_every, resume; the rest zero */
	struct dos_train_config cfg;
	const struct train_preset *preset;          /* --preset, or the default one */
	uint64_t params;                            /* _dos_model_param_count(&cfg.shape, NULL) */
	const char *policy;                         /* never NULL: "dos" by default */
	const char *precision;                      /* "fp32", "bf16" or "fp16" */
	const char *plot, *trace, *dump, *simulate; /* NULL when not given */
	int quiet;
	/* --subgroup-layout: TRAIN_LAYOUT_DEFAULT until dos_train_resolve_layout, which needs
	 * the job's number of ranks */
	enum train_subgroup_layout { TRAIN_LAYOUT_DEFAULT, TRAIN_LAYOUT_TENSORS, TRAIN_LAYOUT_FLAT } subgroup_layout;
};

/* What dos_train_parse_options found: the values are dos-train's exit statuses for help
 * and for bad usage. */
enum {
	TRAIN_OPTIONS_RUN = 0,  /* *out holds the run's settings */
	TRAIN_OPTIONS_HELP = 1, /* --help: the usage text went to stdout */
	TRAIN_OPTIONS_BAD = 2,  /* bad usage: the messages went to err */
};

/* Parses and checks dos-train's options (argv[0] is the program). Re-entrant: getopt's
 * state is reset on entry, nothing is allocated, and nothing but *out, argv's order
 * (getopt_long moves the operands to the end) and the output streams is written. Beyond
 * each option's own range, on TRAIN_OPTIONS_RUN: every shape size is >= 1 and the
 * parameter count fits 64 bits (params >= 1), the subgroup size is >= 1 (and at most
 * params unless --subgroup-size gave it), --resume and --checkpoint-every come with
 * --checkpoint-dir, the loss scale is 0 (off) or >= 1, and the library's own rules hold
 * for AdamW's hyperparameters, the learning-rate schedule, clipping, the subgroup size
 * and the held-out data (a message names the option). Other settings (a hidden size that
 * heads does not divide, a corpus too small for the held-out part) are left to
 * dos-train's later checks and _dos_train_run.
 *
 * getopt_long's own messages (an unknown option, a missing argument) can only go to
 * stderr: they are printed when err is stderr and left out otherwise; the usage text
 * that follows them goes to err either way. */
int dos_train_parse_options(int argc, char **argv, struct train_options *out, FILE *err);

/* Prints the library's last error message on err, prefixed with "dos-train: ", each
 * setting it names (hp->lr, clip_norm, ...) replaced by its option's name. */
void dos_train_print_library_error(FILE *err);

/* Sets cfg.opt.subgroups_follow_tensors from --subgroup-layout, or by default: following
 * the tensors in a single process, where an update then reads backward's gradient of its
 * tensor in place (no gather), and across them in a data-parallel job of several ranks,
 * where every subgroup's gradient is gathered and exchanged anyway and fewer, larger
 * subgroups mean fewer messages. Call once the ranks are known (cfg.dp). */
void dos_train_resolve_layout(struct train_options *o);

/* Warns on err of settings that dos_train_parse_options accepts, since they are legitimate
 * choices, but that may well not be what was meant: a --warmup longer than the run (the
 * learning rate never reaches --lr). Prints nothing when there is nothing to say. */
void dos_train_warn_options(const struct train_options *o, FILE *err);

#endif /* DOS_TRAIN_OPTIONS_H */
