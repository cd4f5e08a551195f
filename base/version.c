/* Version of the loaded library, for programs that check it at run time. */
#include "dos.h"

const char *dos_version_string(void)
{
	return DOS_VERSION_STRING;
}

unsigned dos_version_number(void)
{
	return DOS_VERSION_NUMBER;
}
