/* The scatter exchange of a data-parallel job (scatter.h). */
#include <errno.h>
#include <stdlib.h>

#include "errors.h"
#include "flat.h"
#include "scatter.h"

/* The handles of this rank, each at [s * nranks + c] for subgroup s and chunk c (or, for
 * grad_in, the rank c whose partial it receives); NULL where this rank has none. */
struct _dos_scatter {
	struct _dos_scatter_context ctx;
	int nranks, rank;
	size_t slots;
	starpu_data_handle_t *grad_chunk;   /* this rank's partial gradient, chunk c: every subgroup */
	starpu_data_handle_t *grad_in;      /* rank c's partial of chunk `rank`, which this rank sums */
	starpu_data_handle_t *grad_sum;     /* the sum of chunk c: c = rank, or every c of an owned subgroup */
	starpu_data_handle_t *weight_chunk; /* the updated weights, chunk c: every subgroup */
};

/* Chunk c of subgroup s is [chunk_begin(c), chunk_begin(c + 1)) of its `len` elements;
 * there are as many as ranks, or one per element of a shorter subgroup. */
static uint32_t nchunks(const struct _dos_scatter *x, uint32_t s)
{
	uint64_t len = _dos_subgroup_len(x->ctx.map, s);
	return (uint32_t)(len < (uint64_t)x->nranks ? len : (uint64_t)x->nranks);
}

static uint64_t chunk_begin(uint64_t len, uint32_t nchunk, uint32_t c)
{
	return (uint64_t)c * len / nchunk;
}

static starpu_data_handle_t *slot(starpu_data_handle_t *array, const struct _dos_scatter *x, uint32_t s, uint32_t c)
{
	return &array[(size_t)s * (size_t)x->nranks + c];
}

static void register_vector(starpu_data_handle_t *h, uint64_t len, size_t elemsize)
{
	starpu_vector_data_register(h, -1, 0, (uint32_t)len, elemsize);
}

int _dos_scatter_create(struct _dos_scatter **out, const struct _dos_scatter_context *ctx)
{
	const struct dos_data_parallel *dp = &ctx->cfg->dp;
	uint32_t N = ctx->map->nsubgroups;
	struct _dos_scatter *x = calloc(1, sizeof *x);
	if (!x)
		return DOS_FAIL(-ENOMEM, "no memory for the scatter exchange");
	x->ctx = *ctx;
	x->nranks = _dos_dp_size(dp);
	x->rank = dp->rank;
	x->slots = (size_t)N * (size_t)x->nranks;
	starpu_data_handle_t **arrays[] = {&x->grad_chunk, &x->grad_in, &x->grad_sum, &x->weight_chunk};
	for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
		if (!(*arrays[a] = calloc(x->slots, sizeof **arrays[a]))) {
			_dos_scatter_destroy(x);
			return DOS_FAIL(-ENOMEM, "no memory for the %zu chunk handles of the scatter exchange",
					x->slots);
		}
	size_t grad_size = dos_dtype_size(ctx->cfg->grad_dtype), weight_size = dos_dtype_size(ctx->cfg->weight_dtype);
	for (uint32_t s = 0; s < N; s++) {
		uint64_t len = _dos_subgroup_len(ctx->map, s);
		uint32_t k = nchunks(x, s);
		int owned = _dos_dp_owner(dp, N, s) == x->rank;
		for (uint32_t c = 0; c < k; c++) {
			uint64_t clen = chunk_begin(len, k, c + 1) - chunk_begin(len, k, c);
			register_vector(slot(x->grad_chunk, x, s, c), clen, grad_size);
			register_vector(slot(x->weight_chunk, x, s, c), clen, weight_size);
			if (owned || c == (uint32_t)x->rank)
				register_vector(slot(x->grad_sum, x, s, c), clen, grad_size);
		}
		if ((uint32_t)x->rank < k) { /* this rank sums chunk `rank`: the others' partials */
			uint64_t clen = chunk_begin(len, k, x->rank + 1) - chunk_begin(len, k, x->rank);
			for (int r = 0; r < x->nranks; r++)
				if (r != x->rank)
					register_vector(slot(x->grad_in, x, s, r), clen, grad_size);
		}
	}
	*out = x;
	return 0;
}

void _dos_scatter_destroy(struct _dos_scatter *x)
{
	if (!x)
		return;
	starpu_data_handle_t *arrays[] = {x->grad_chunk, x->grad_in, x->grad_sum, x->weight_chunk};
	for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++) {
		for (size_t i = 0; arrays[a] && i < x->slots; i++)
			if (arrays[a][i])
				starpu_data_unregister(arrays[a][i]);
		free(arrays[a]);
	}
	free(x);
}

/* Submits a copy of one subgroup between itself whole (`whole`) and its k chunks
 * (`chunks`), in either direction; `where` 0 lets the scheduler choose. */
static void submit_chunk_copy(struct _dos_scatter *x, uint32_t s, int to_chunks, starpu_data_handle_t whole,
			      starpu_data_handle_t *chunks, enum dos_dtype dtype, enum _dos_task_phase phase)
{
	uint64_t len = _dos_subgroup_len(x->ctx.map, s);
	uint32_t k = nchunks(x, s);
	struct dos_flat_piece *pieces = malloc(k * sizeof *pieces);
	STARPU_ASSERT_MSG(pieces, "out of memory cutting subgroup %u into %u chunks", s, k);
	for (uint32_t c = 0; c < k; c++) {
		uint64_t begin = chunk_begin(len, k, c);
		pieces[c] = (struct dos_flat_piece){.source = to_chunks ? 0 : c,
						    .destination = to_chunks ? c : 0,
						    .source_offset = to_chunks ? begin : 0,
						    .destination_offset = to_chunks ? 0 : begin,
						    .len = chunk_begin(len, k, c + 1) - begin};
	}
	struct starpu_task *task;
	int err = to_chunks ? _dos_flat_copy_task_create(chunks, k, dtype, &whole, dtype, 1, pieces, k,
							 x->ctx.cfg->sched_ctx, &task)
			    : _dos_flat_copy_task_create(&whole, 1, dtype, chunks, dtype, k, pieces, k,
							 x->ctx.cfg->sched_ctx, &task);
	STARPU_ASSERT_MSG(err == 0, "out of memory building the chunk copy of subgroup %u", s);
	free(pieces);
	if (to_chunks)
		/* The owner's updated weights, cut into the chunks it sends: every other rank's
		 * refresh, and so its next forward, waits for them, and the owner of the first
		 * layers updates last. This 0.1 ms GPU task becomes ready when its update ends,
		 * behind the refreshes and updates queued meanwhile, which wait for their
		 * transfers; at priority 1 (the optimizer's tasks have 0) it passes them in a
		 * policy that honours priorities (dos; dmda keeps StarPU's default range, [0,
		 * 0]). On 4 simulated nodes of 7b the last five copies used to wait up to 120
		 * ms (results/scatter-own-chunk-2026-12-03.md). */
		task->priority = 1;
	x->ctx.submit(x->ctx.opt, task, phase, s);
}

/* This rank's partial gradient of subgroup s, from the tensor gradients its pieces lie
 * in, straight into its chunks (the pieces cut at the chunks' bounds). */
static void submit_gather_chunks(struct _dos_scatter *x, uint32_t s)
{
	const struct dos_subgroup_map *map = x->ctx.map;
	const struct _dos_optimizer_config *cfg = x->ctx.cfg;
	uint64_t len = _dos_subgroup_len(map, s);
	uint32_t first = map->subgroup_first[s], count = map->subgroup_first[s + 1] - first, k = nchunks(x, s);
	starpu_data_handle_t *sources = malloc(count * sizeof *sources);
	struct dos_flat_piece *pieces = malloc((count + k) * sizeof *pieces);
	STARPU_ASSERT_MSG(sources && pieces, "out of memory building the gradient gather of subgroup %u", s);
	uint32_t npieces = 0, c = 0;
	for (uint32_t i = 0; i < count; i++) {
		const struct dos_piece *p = &map->pieces[first + i];
		sources[i] = x->ctx.tensor_grad[p->tensor];
		for (uint64_t at = p->subgroup_offset, end = at + p->len; at < end;) {
			while (chunk_begin(len, k, c + 1) <= at)
				c++;
			uint64_t chunk_end = chunk_begin(len, k, c + 1),
				 take = (end < chunk_end ? end : chunk_end) - at;
			pieces[npieces++] =
				(struct dos_flat_piece){.source = i,
							.destination = c,
							.source_offset = p->tensor_offset + (at - p->subgroup_offset),
							.destination_offset = at - chunk_begin(len, k, c),
							.len = take};
			at += take;
		}
	}
	struct starpu_task *task;
	int err = _dos_flat_copy_task_create(slot(x->grad_chunk, x, s, 0), k, cfg->grad_dtype, sources,
					     cfg->tensor_grad_dtype, count, pieces, npieces, cfg->sched_ctx, &task);
	STARPU_ASSERT_MSG(err == 0, "out of memory building the gradient gather of subgroup %u", s);
	free(sources);
	free(pieces);
	if (x->ctx.copies_on_gpu) /* where the tensor gradients are */
		task->where = STARPU_CUDA;
	x->ctx.submit(x->ctx.opt, task, DOS_TASK_GATHER, s);
}

static void release_host_copy(void *handle)
{
	starpu_data_release_on_node(handle, STARPU_MAIN_RAM);
}

/* Asks for a host copy of chunk h as soon as the gather that writes it ends. The sum that
 * reads it runs on a CPU worker (dos_grad_sum has no GPU version), but it is pushed, and
 * its input fetched, only when the other ranks' partials have arrived; by then the copies
 * of every chunk this rank sends, requested as each gather ends, are queued ahead of it on
 * the GPU-to-host link, and the sums wait for all of them. Asked for here, the copy joins
 * the link's queue beside the sends of the same subgroup. */
static void copy_to_host_when_written(starpu_data_handle_t h)
{
	int err = starpu_data_acquire_on_node_cb(h, STARPU_MAIN_RAM, STARPU_R, release_host_copy, h);
	STARPU_ASSERT_MSG(err == 0, "StarPU refused a host copy of a gradient chunk (%d)", err);
}

static uint64_t message_index(const struct _dos_scatter *x, uint32_t s, uint32_t c)
{
	return (uint64_t)s * (uint64_t)x->nranks + c;
}

void _dos_scatter_submit_gradients(struct _dos_scatter *x, starpu_data_handle_t *grad)
{
	const struct _dos_optimizer_config *cfg = x->ctx.cfg;
	const struct dos_data_parallel *dp = &cfg->dp;
	uint32_t N = x->ctx.map->nsubgroups, me = (uint32_t)x->rank;
	starpu_data_handle_t *partials = malloc((size_t)x->nranks * sizeof *partials);
	STARPU_ASSERT_MSG(partials, "out of memory for %d partial gradients", x->nranks);
	for (uint32_t s = 0; s < N; s++) {
		int owner = _dos_dp_owner(dp, N, s);
		uint32_t k = nchunks(x, s);
		submit_gather_chunks(x, s);
		for (uint32_t c = 0; c < k; c++)
			if (c != me)
				_dos_dp_send(*slot(x->grad_chunk, x, s, c), (int)c, DOS_DP_GRAD_CHUNK,
					     message_index(x, s, c));
		if (me < k) { /* chunk `me`: every rank's partial, summed in rank order */
			if (x->ctx.copies_on_gpu)
				copy_to_host_when_written(*slot(x->grad_chunk, x, s, me));
			for (int r = 0; r < x->nranks; r++) {
				partials[r] =
					r == x->rank ? *slot(x->grad_chunk, x, s, me) : *slot(x->grad_in, x, s, r);
				if (r != x->rank)
					_dos_dp_recv(partials[r], r, DOS_DP_GRAD_CHUNK, message_index(x, s, me));
			}
			struct starpu_task *task;
			starpu_data_handle_t sum = *slot(x->grad_sum, x, s, me);
			int err = _dos_grad_sum_task_create(sum, cfg->grad_dtype, partials, (uint32_t)x->nranks,
							    cfg->grad_dtype, cfg->sched_ctx, &task);
			STARPU_ASSERT_MSG(err == 0, "out of memory building the gradient sum of subgroup %u", s);
			x->ctx.submit(x->ctx.opt, task, DOS_TASK_GATHER, s);
			if (owner != x->rank)
				_dos_dp_send(sum, owner, DOS_DP_GRAD_SUM, message_index(x, s, me));
		}
		if (owner == x->rank) { /* the sums of every chunk, put together */
			for (uint32_t c = 0; c < k; c++)
				if (c != me)
					_dos_dp_recv(*slot(x->grad_sum, x, s, c), (int)c, DOS_DP_GRAD_SUM,
						     message_index(x, s, c));
			submit_chunk_copy(x, s, 0, grad[s], slot(x->grad_sum, x, s, 0), cfg->grad_dtype,
					  DOS_TASK_GATHER);
		}
	}
	free(partials);
}

void _dos_scatter_submit_weights(struct _dos_scatter *x, starpu_data_handle_t *weights)
{
	const struct _dos_optimizer_config *cfg = x->ctx.cfg;
	const struct dos_data_parallel *dp = &cfg->dp;
	uint32_t N = x->ctx.map->nsubgroups, me = (uint32_t)x->rank;
	for (uint32_t s = 0; s < N; s++) {
		int owner = _dos_dp_owner(dp, N, s);
		uint32_t k = nchunks(x, s);
		starpu_data_handle_t whole = weights[s];
		if (owner == x->rank) { /* chunk c to rank c, its own chunk to every rank */
			submit_chunk_copy(x, s, 1, whole, slot(x->weight_chunk, x, s, 0), cfg->weight_dtype,
					  DOS_TASK_REFRESH);
			for (uint32_t c = 0; c < k; c++)
				for (int r = 0; r < x->nranks; r++)
					if (r != owner && (c == (uint32_t)owner || (uint32_t)r == c))
						_dos_dp_send(*slot(x->weight_chunk, x, s, c), r, DOS_DP_WEIGHT_CHUNK,
							     message_index(x, s, c));
			continue;
		}
		/* no copy puts them together: the refresh reads the chunks (_dos_scatter_refresh_pieces) */
		for (uint32_t c = 0; c < k; c++) {
			starpu_data_handle_t h = *slot(x->weight_chunk, x, s, c);
			/* from the owner: its own chunk and this rank's; the others from their rank */
			int from = c == (uint32_t)owner || c == me ? owner : (int)c;
			_dos_dp_recv(h, from, DOS_DP_WEIGHT_CHUNK, message_index(x, s, c));
			if (c == me) /* passed on to the ranks that do not have it */
				for (int r = 0; r < x->nranks; r++)
					if (r != owner && r != x->rank)
						_dos_dp_send(h, r, DOS_DP_WEIGHT_CHUNK, message_index(x, s, c));
		}
	}
}

uint32_t _dos_scatter_refresh_pieces(const struct _dos_scatter *x, uint32_t s, starpu_data_handle_t whole, uint64_t at,
				     uint64_t len, uint64_t destination_offset, starpu_data_handle_t *sources,
				     uint32_t nsources, struct dos_flat_piece *pieces)
{
	const struct dos_data_parallel *dp = &x->ctx.cfg->dp;
	if (_dos_dp_owner(dp, x->ctx.map->nsubgroups, s) == x->rank) { /* the update wrote it whole here */
		sources[nsources] = whole;
		pieces[0] = (struct dos_flat_piece){
			.source = nsources, .source_offset = at, .destination_offset = destination_offset, .len = len};
		return 1;
	}
	uint64_t sublen = _dos_subgroup_len(x->ctx.map, s);
	uint32_t k = nchunks(x, s), n = 0, c = 0;
	for (uint64_t end = at + len; at < end; n++) {
		while (chunk_begin(sublen, k, c + 1) <= at)
			c++;
		uint64_t chunk_end = chunk_begin(sublen, k, c + 1), take = (end < chunk_end ? end : chunk_end) - at;
		sources[nsources + n] = *slot(x->weight_chunk, x, s, c);
		pieces[n] = (struct dos_flat_piece){.source = nsources + n,
						    .source_offset = at - chunk_begin(sublen, k, c),
						    .destination_offset = destination_offset,
						    .len = take};
		at += take;
		destination_offset += take;
	}
	return n;
}

void _dos_scatter_drop(struct _dos_scatter *x)
{
	starpu_data_handle_t *arrays[] = {x->grad_chunk, x->grad_in, x->grad_sum, x->weight_chunk};
	for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
		for (size_t i = 0; i < x->slots; i++)
			if (arrays[a][i])
				starpu_data_invalidate_submit(arrays[a][i]);
}
