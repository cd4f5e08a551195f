/* Which GPUs each rank of a node drives (graph/rank_binding.h): one rank per GPU, several
 * ranks per GPU, and one rank driving several GPUs (StarPU's one rank per node) must each
 * give every GPU to exactly one rank when there are at least as many GPUs as ranks, every
 * rank a GPU when there are more ranks, and contiguous blocks whose sizes differ by at
 * most one. Then the binding itself on this machine: a rank without GPUs leaves StarPU's
 * CUDA workers alone and is bound to cores it may use. */
#include <errno.h>
#include <starpu.h>

#include "rank_binding.h"
#include "test_util.h"

static void check_split(int ranks, int gpus)
{
	int owner[64];
	for (int g = 0; g < gpus; g++)
		owner[g] = -1;
	int smallest = gpus + 1, largest = 0;
	for (int r = 0; r < ranks; r++) {
		int first, count = _dos_rank_gpus(r, ranks, gpus, &first);
		if (gpus == 0) {
			CHECK(count == 0 && first == -1, "no GPU: rank %d got %d from %d", r, count, first);
			continue;
		}
		CHECK(count >= 1 && first >= 0 && first + count <= gpus, "%d ranks, %d GPUs: rank %d got GPUs %d+%d",
		      ranks, gpus, r, first, count);
		if (ranks >= gpus) {
			CHECK(count == 1 && first == r % gpus, "%d ranks, %d GPUs: rank %d got GPU %d (count %d)",
			      ranks, gpus, r, first, count);
			continue;
		}
		for (int g = first; g < first + count; g++) {
			CHECK(owner[g] == -1, "%d ranks, %d GPUs: GPU %d given to ranks %d and %d", ranks, gpus, g,
			      owner[g], r);
			owner[g] = r;
		}
		smallest = count < smallest ? count : smallest;
		largest = count > largest ? count : largest;
	}
	if (gpus > 0 && ranks < gpus) {
		for (int g = 0; g < gpus; g++)
			CHECK(owner[g] >= 0, "%d ranks, %d GPUs: GPU %d driven by no rank", ranks, gpus, g);
		CHECK(largest - smallest <= 1, "%d ranks, %d GPUs: blocks of %d to %d GPUs", ranks, gpus, smallest,
		      largest);
	}
}

int main(void)
{
	for (int gpus = 0; gpus <= 16; gpus++)
		for (int ranks = 1; ranks <= 20; ranks++)
			check_split(ranks, gpus);
	int first, count = _dos_rank_gpus(0, 1, 8, &first);
	CHECK(count == 8 && first == 0, "one rank on a node of 8 GPUs drives %d from %d", count, first);
	count = _dos_rank_gpus(1, 2, 8, &first);
	CHECK(count == 4 && first == 4, "rank 1 of 2 on 8 GPUs drives %d from %d", count, first);
	count = _dos_rank_gpus(5, 8, 4, &first);
	CHECK(count == 1 && first == 1, "rank 5 of 8 on 4 GPUs drives %d from %d", count, first);
	CHECK(_dos_rank_gpus(-1, 2, 4, &first) == 0 && _dos_rank_gpus(0, 0, 4, &first) == 0, "bad ranks accepted");

	/* the binding itself, with the GPUs this machine shows (none in CI) */
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	int ncuda_before = conf.ncuda;
	struct dos_rank_binding b;
	unsetenv("DOS_BIND");
	CHECK(_dos_bind_rank(0, 1, &conf, &b) == 0, "binding failed");
	CHECK(b.ncores >= 1, "bound to %d cores: %s", b.ncores, b.text);
	CHECK(b.ngpus >= 0 && (b.ngpus > 0) == (b.gpu >= 0), "gpu %d, ngpus %d", b.gpu, b.ngpus);
	if (b.ngpus == 0)
		CHECK(conf.ncuda == ncuda_before && strstr(b.text, "no GPU"), "no GPU, yet: ncuda %d, '%s'", conf.ncuda,
		      b.text);
	else if (!getenv("STARPU_NCUDA") && !getenv("STARPU_WORKERS_CUDAID"))
		CHECK(conf.ncuda == b.ngpus && conf.workers_cuda_gpuid[b.ngpus - 1] == (unsigned)(b.gpu + b.ngpus - 1),
		      "the rank drives %d GPUs, StarPU is told %d", b.ngpus, conf.ncuda);
	printf("rank binding: every GPU to one rank, blocks within one GPU of each other; this machine: %s\n", b.text);
	setenv("DOS_QUIET", "1", 1);
	CHECK(_dos_bind_rank(2, 2, &conf, &b) == -EINVAL, "local rank 2 of 2 accepted");
	return 0;
}
