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

int _dos_make_folder(const char *path, char *why, size_t size)
{
	char buf[PATH_MAX];
	size_t len = path ? strlen(path) : 0;
	if (len == 0) {
		snprintf(why, size, "the folder name is empty");
		return -EINVAL;
	}
	if (len >= sizeof buf) {
		snprintf(why, size, "the folder name '%.80s...' is longer than %d bytes", path, PATH_MAX - 1);
		return -ENAMETOOLONG;
	}
	memcpy(buf, path, len + 1);
	/* every parent from the top down, then the folder itself */
	for (char *p = buf + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char was = *p;
		*p = '\0';
		struct stat st;
		if (buf[0] && mkdir(buf, 0755) != 0 && errno != EEXIST) {
			int err = errno;
			snprintf(why, size, "cannot create the folder %s: %s", buf, strerror(err));
			return -err;
		}
		if (stat(buf[0] ? buf : "/", &st) != 0) {
			int err = errno;
			snprintf(why, size, "cannot create the folder %s: %s", buf, strerror(err));
			return -err;
		}
		if (!S_ISDIR(st.st_mode)) {
			snprintf(why, size, "%s %s not a folder", buf, strcmp(buf, path) ? "exists and is" : "is");
			return -ENOTDIR;
		}
		*p = was;
		if (was == '\0')
			return 0;
		while (p[1] == '/')
			p++;
		if (p[1] == '\0')
			return 0; /* a trailing slash */
	}
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
