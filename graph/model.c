/* placeholder: being written */
extern int dos_placeholder_model;
