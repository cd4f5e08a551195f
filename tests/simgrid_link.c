/* Linked against the SimGrid build of StarPU by test_simgrid_link.sh: proves that build
 * is usable for the simulated machines (starpu.h renames main() under SimGrid). */
#include <starpu.h>

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
#ifndef STARPU_SIMGRID
#error "not the SimGrid build of StarPU"
#endif
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	return starpu_init(&conf) == 0 ? (starpu_shutdown(), 0) : 1;
}
