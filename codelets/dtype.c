/* Element types of gradients and 16-bit weights. */
#include "dos.h"

size_t dos_dtype_size(enum dos_dtype dtype)
{
	switch (dtype) {
	case DOS_FP32:
		return 4;
	case DOS_FP16:
	case DOS_BF16:
		return 2;
	}
	return 0;
}

const char *dos_dtype_name(enum dos_dtype dtype)
{
	switch (dtype) {
	case DOS_FP32:
		return "fp32";
	case DOS_FP16:
		return "fp16";
	case DOS_BF16:
		return "bf16";
	}
	return "invalid";
}
