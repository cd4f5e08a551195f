/* Folders and output files checked before any work (files.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"

/* A folder's name into buf (PATH_MAX bytes), to be cut at each of its parts: refused when
 * empty or too long. */
static int copy_folder_name(const char *path, char *buf, char *why, size_t size)
{
	size_t len = path ? strlen(path) : 0;
	if (len == 0) {
		snprintf(why, size, "the folder name is empty");
		return -EINVAL;
	}
	if (len >= PATH_MAX) {
		snprintf(why, size, "the folder name '%.80s...' is longer than %d bytes", path, PATH_MAX - 1);
		return -ENAMETOOLONG;
	}
	memcpy(buf, path, len + 1);
	return 0;
}

/* Calls visit with buf cut after each of its parts, from the top down, the last time whole
 * (repeated and trailing slashes add no part); stops at the first nonzero return of visit,
 * which it returns, buf whole again. */
static int for_each_part(char *buf, int (*visit)(const char *part, void *arg), void *arg)
{
	for (char *p = buf + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char was = *p;
		*p = '\0';
		int stop = visit(buf, arg);
		*p = was;
		if (stop || was == '\0')
			return stop;
		while (p[1] == '/')
			p++;
		if (p[1] == '\0')
			return 0; /* a trailing slash */
	}
}

struct part_visit {
	const char *path;
	char *why;
	size_t size;
	size_t deepest; /* look_at_part: the length of the deepest part that exists */
};

/* Makes one part of a folder's name (for_each_part): 0, or -errno after a message. */
static int make_part(const char *part, void *arg)
{
	struct part_visit *v = arg;
	struct stat st;
	if (part[0] && mkdir(part, 0755) != 0 && errno != EEXIST) {
		int err = errno;
		snprintf(v->why, v->size, "cannot create the folder %s: %s", part, strerror(err));
		return -err;
	}
	if (stat(part[0] ? part : "/", &st) != 0) {
		int err = errno;
		snprintf(v->why, v->size, "cannot create the folder %s: %s", part, strerror(err));
		return -err;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(v->why, v->size, "%s %s not a folder", part, strcmp(part, v->path) ? "exists and is" : "is");
		return -ENOTDIR;
	}
	return 0;
}

int _dos_make_folder(const char *path, char *why, size_t size)
{
	char buf[PATH_MAX];
	int refused = copy_folder_name(path, buf, why, size);
	if (refused)
		return refused;
	/* every parent from the top down, then the folder itself */
	struct part_visit v = {path, why, size, 0};
	return for_each_part(buf, make_part, &v);
}

int _dos_check_writable_folder(const char *path, char *why, size_t size)
{
	char probe[PATH_MAX];
	struct stat st;
	if (stat(path, &st) != 0) {
		int err = errno;
		snprintf(why, size, "the folder %s: %s", path, strerror(err));
		return -err;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(why, size, "%s is not a folder", path);
		return -ENOTDIR;
	}
	if (snprintf(probe, sizeof probe, "%s/.dos-probe-%ld", path, (long)getpid()) >= (int)sizeof probe) {
		snprintf(why, size, "the folder name '%.80s...' is too long", path);
		return -ENAMETOOLONG;
	}
	int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) /* a probe of a killed process with our pid */
		fd = open(probe, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = errno;
		snprintf(why, size, "cannot create files in the folder %s: %s", path, strerror(err));
		return -err;
	}
	close(fd);
	unlink(probe);
	return 0;
}

/* Looks at one part of a folder's name (for_each_part): 0 when it is a folder, 1 when it
 * does not exist (it and what follows are to be made), else -errno after a message. */
static int look_at_part(const char *part, void *arg)
{
	struct part_visit *v = arg;
	struct stat st;
	if (stat(part, &st) != 0) {
		if (errno == ENOENT)
			return 1;
		int err = errno;
		snprintf(v->why, v->size, "%s: %s", part, strerror(err));
		return -err;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(v->why, v->size, "%s is not a folder", part);
		return -ENOTDIR;
	}
	v->deepest = strlen(part);
	return 0;
}

int _dos_check_folder_can_be_made(const char *path, char *why, size_t size)
{
	char buf[PATH_MAX], probe[PATH_MAX + 32];
	int refused = copy_folder_name(path, buf, why, size);
	if (refused)
		return refused;
	/* every part from the top down, as _dos_make_folder, looked at only */
	struct part_visit v = {path, why, size, 0};
	int stop = for_each_part(buf, look_at_part, &v);
	if (stop <= 0)
		return stop; /* refused, or all there: nothing to make (a read-only folder of models is fine) */
	size_t deepest = v.deepest;
	if (deepest)
		buf[deepest] = '\0';
	else /* nothing of it exists: it is made in the root or the working folder */
		snprintf(buf, sizeof buf, "%s", path[0] == '/' ? "/" : ".");
	snprintf(probe, sizeof probe, "%s/.dos-probe-%ld", buf, (long)getpid());
	if (mkdir(probe, 0700) != 0 && errno != EEXIST) { /* EEXIST: a probe of a killed process with our pid */
		int err = errno;
		snprintf(why, size, "cannot create a folder in %s: %s", buf, strerror(err));
		return -err;
	}
	rmdir(probe);
	return 0;
}

int _dos_check_output_file(const char *path, char *why, size_t size)
{
	if (!path || !*path) {
		snprintf(why, size, "the file name is empty");
		return -EINVAL;
	}
	struct stat st;
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode)) {
			snprintf(why, size, "%s is a folder, not a file", path);
			return -EISDIR;
		}
		if (!S_ISREG(st.st_mode)) {
			snprintf(why, size, "%s exists and is not a regular file", path);
			return -EINVAL;
		}
		int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC); /* not truncated: nothing changes */
		if (fd < 0) {
			int err = errno;
			snprintf(why, size, "cannot write %s: %s", path, strerror(err));
			return -err;
		}
		close(fd);
	} else if (errno != ENOENT) {
		int err = errno;
		snprintf(why, size, "%s: %s", path, strerror(err));
		return -err;
	}
	size_t len = strlen(path);
	char folder[PATH_MAX];
	if (len >= sizeof folder) {
		snprintf(why, size, "the file name '%.80s...' is longer than %d bytes", path, PATH_MAX - 1);
		return -ENAMETOOLONG;
	}
	if (path[len - 1] == '/') {
		snprintf(why, size, "%s names a folder, not a file", path);
		return -EISDIR;
	}
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(folder, sizeof folder, ".");
	else if (slash == path)
		snprintf(folder, sizeof folder, "/");
	else
		snprintf(folder, sizeof folder, "%.*s", (int)(slash - path), path);
	char inner[512];
	int err = _dos_check_writable_folder(folder, inner, sizeof inner);
	if (err)
		snprintf(why, size, "cannot write %s: %s", path, inner);
	return err;
}
