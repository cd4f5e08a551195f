/* The forecast of the application's GPU memory (sched/app_memory.c) on made-up
 * iterations whose answers are worked out by hand: a weight read first (its value comes
 * from before, so it is live from the start of the iteration), activations live from
 * their writer to their last reader, data homed on the GPU live throughout, the
 * optimizer's own data never counted; the peak over the iteration and within the update
 * window; the first window (start to first plan) flagged as such; data unused in an
 * iteration forgotten; the optimizer's gradient and 16-bit weight copies from the task
 * that makes them on the GPU to the update or refresh that last uses them; a key written
 * again (a handle's address taken by the next micro-batch's activation) holding two values,
 * each live from its writer to its last reader, not one from the first to the last. */
#include "app_memory.h"
#include "test_util.h"

/* distinct keys: the forecast never dereferences them */
static const char weight = 0, act = 0, act2 = 0, homed = 0, opt_state = 0, late_state = 0;

static void task(struct dos_app_memory *am, double start, double end, const void *key, double bytes, int always_there,
		 int reads)
{
	_dos_app_memory_use(am, key, bytes, always_there, reads, start, end);
	_dos_app_memory_task(am, start, end);
}

int main(void)
{
	struct dos_app_memory am;
	struct dos_app_exclusions optimizer = {0};
	_dos_app_memory_init(&am, &optimizer);
	CHECK(_dos_app_exclusions_add(&optimizer, &opt_state) == 1 &&
		      _dos_app_exclusions_add(&optimizer, &opt_state) == 0,
	      "an exclusion added twice is new only the first time");
	CHECK(_dos_app_exclusions_has(&optimizer, &opt_state) && !_dos_app_exclusions_has(&optimizer, &weight),
	      "the exclusions hold what was added, and only that");
	task(&am, 0, 1, &act, 1e6, 0, 0); /* before anything started: ignored */
	_dos_app_memory_plan(&am, 0.0);
	CHECK(!am.last.learned, "a forecast before any iteration was measured");

	/* The first window, up to the first plan at t = 10. Live: weight [0, 9] (read
	 * first), act [2, 8], act2 [4, 6], homed [0, 10]; the optimizer's 200 bytes never, nor
	 * its 400 bytes used before they were known to be the optimizer's. */
	task(&am, 1, 2, &weight, 100, 0, 1);
	task(&am, 2, 3, &act, 50, 0, 0);
	task(&am, 3, 4, &homed, 10, 1, 1);
	task(&am, 4, 5, &act2, 30, 0, 0);
	task(&am, 5, 6, &act2, 30, 0, 1);
	task(&am, 5, 6, &opt_state, 200, 0, 1);
	_dos_app_memory_use(&am, &late_state, 400, 0, 1, 5, 6); /* the same task's other buffer */
	if (_dos_app_exclusions_add(&optimizer, &late_state) == 1)
		_dos_app_memory_exclude(&am, &late_state);
	task(&am, 7, 8, &act, 50, 0, 1);
	task(&am, 8, 9, &weight, 100, 0, 1);
	_dos_app_memory_plan(&am, 10.0);
	CHECK(am.last.learned && !am.last.whole_iteration, "first window: learned %d, whole %d", am.last.learned,
	      am.last.whole_iteration);
	CHECK(am.last.iteration_peak_bytes == 190, "first window peak %g, expected 190 (100 + 50 + 30 + 10)",
	      am.last.iteration_peak_bytes);
	CHECK(am.last.iteration_seconds == 10 && am.last.gpu_busy_seconds == 8, "first window: %g s, %g s busy",
	      am.last.iteration_seconds, am.last.gpu_busy_seconds);

	/* A whole iteration from t = 10 to 20, its updates ending at 12. act2 is gone (the
	 * next step did not use it); weight, read first, is live from 10 to 19; act from 14
	 * to 18; homed throughout. Window [10, 12]: 100 + 10. Whole: 100 + 50 + 10. */
	_dos_app_memory_update_ended(&am, 11.5);
	_dos_app_memory_update_ended(&am, 12.0);
	task(&am, 13, 14, &weight, 100, 0, 1);
	task(&am, 14, 15, &act, 50, 0, 0);
	task(&am, 15, 16, &homed, 10, 1, 1);
	task(&am, 17, 18, &act, 50, 0, 1);
	task(&am, 18, 19, &weight, 100, 0, 1);
	_dos_app_memory_plan(&am, 20.0);
	CHECK(am.last.learned && am.last.whole_iteration, "second window not a whole iteration");
	CHECK(am.last.iteration_peak_bytes == 160, "iteration peak %g, expected 160", am.last.iteration_peak_bytes);
	CHECK(am.last.update_peak_bytes == 110, "update-window peak %g, expected 110", am.last.update_peak_bytes);
	CHECK(am.last.update_window_seconds == 2 && am.last.iteration_seconds == 10,
	      "window %g s of an iteration of %g s", am.last.update_window_seconds, am.last.iteration_seconds);
	CHECK(am.last.gpu_busy_seconds == 5, "busy %g s, expected 5", am.last.gpu_busy_seconds);
	/* weight, act, homed and the late exclusion remain (the other one never entered the
	 * table); act2 was dropped */
	CHECK(am.count == 4, "%lu keys kept, expected 4", am.count);

	/* An iteration where nothing is written: the peak is what was carried in. And many
	 * keys: the table grows and every one counts. */
	static char many[5000];
	for (int i = 0; i < 5000; i++)
		task(&am, 21, 22, &many[i], 1, 0, 1);
	_dos_app_memory_plan(&am, 30.0);
	CHECK(am.last.iteration_peak_bytes == 5000, "5000 one-byte values read: peak %g", am.last.iteration_peak_bytes);

	/* The optimizer's copies (neither state nor homed on the GPU): a gradient that the
	 * gather writes on the GPU at [31, 32] lives until the update that reads it ends, at
	 * 36, wherever that update ran; an activation [34, 35.5] overlaps it (20 + 50). A
	 * gradient no GPU task made (an update on the CPU of a host gradient) is not counted:
	 * the update's read of it records nothing. The 16-bit weights an update writes
	 * at 37 live until the refresh reads them at [38, 39] (were they carried in, from 30,
	 * 10 more at the peak). */
	static const char grad = 0, host_grad = 0, w16 = 0;
	task(&am, 31, 32, &grad, 20, 0, 0);
	task(&am, 34, 35, &act, 50, 0, 0);
	task(&am, 35, 35.5, &act, 50, 0, 1);
	_dos_app_memory_update_use(&am, &grad, 1, 36);
	_dos_app_memory_update_use(&am, &host_grad, 1, 36);
	_dos_app_memory_update_use(&am, &w16, 0, 37);
	task(&am, 38, 39, &w16, 10, 0, 1);
	_dos_app_memory_plan(&am, 40.0);
	CHECK(am.last.iteration_peak_bytes == 70, "optimizer copies: peak %g, expected 70 (gradient + activation)",
	      am.last.iteration_peak_bytes);

	/* Two micro-batches whose activations take the same keys: act holds the first one's
	 * value [41, 43], then the second's [45, 47]; act2 lives [43.5, 44.5] in between and
	 * weight, read first, [40, 48]. Peak: 100 + 50, never act2 beside act (which a single
	 * span [41, 47] of act would add: 180). */
	task(&am, 41, 42, &act, 50, 0, 0);
	task(&am, 42, 43, &act, 50, 0, 1);
	task(&am, 43.5, 44, &act2, 30, 0, 0);
	task(&am, 44, 44.5, &act2, 30, 0, 1);
	task(&am, 45, 46, &act, 50, 0, 0);
	task(&am, 46, 47, &act, 50, 0, 1);
	task(&am, 47, 48, &weight, 100, 0, 1);
	_dos_app_memory_plan(&am, 50.0);
	CHECK(am.last.iteration_peak_bytes == 150, "a key written twice: peak %g, expected 150 (weight + act)",
	      am.last.iteration_peak_bytes);
	_dos_app_memory_free(&am);
	_dos_app_exclusions_free(&optimizer);
	printf("app memory forecast: peaks, windows and exclusions as worked out by hand\n");
	return 0;
}
