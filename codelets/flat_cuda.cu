/* placeholder: being written */
extern int dos_placeholder_flat_cuda;
