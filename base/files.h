/* Where a run writes: folders made with their parents, and outputs checked before any
 * work, so that a bad path is refused at once instead of after hours of training. Each
 * returns 0 or a negative errno and writes what went wrong, naming the path, into
 * why (size bytes). */
#ifndef DOS_FILES_H
#define DOS_FILES_H

#include <stddef.h>

/* Creates the folder `path` and its missing parents (mode 0755 before the umask); one
 * that exists is fine. -ENOTDIR when `path` or a parent is something else. */
int _dos_make_folder(const char *path, char *why, size_t size);

/* Whether a file can be created in the folder `path`: creates and removes a probe file
 * there (access() alone says yes to root on a read-only mount, or no for ACLs it
 * misjudges). */
int _dos_check_writable_folder(const char *path, char *why, size_t size);

/* Whether the folder `path` is there or can be made, with its parents, by another program
 * (StarPU): every part of it that exists is a folder and, when some part is missing, the
 * deepest that exists takes a new folder (probed by creating and removing one there:
 * access() misjudges root, and mkdir is what such a program does). A folder that is all
 * there passes without a probe, writable or not. Creates nothing that
 * stays, so that a run refused for it leaves nothing behind. -ENOTDIR when a part is
 * something else. */
int _dos_check_folder_can_be_made(const char *path, char *why, size_t size);

/* Whether `path` can be written as a file: not empty, not a folder or any other
 * non-regular file when it exists, in a folder that exists and takes new files. Creates
 * nothing there (the probe is removed). */
int _dos_check_output_file(const char *path, char *why, size_t size);

#endif /* DOS_FILES_H */
