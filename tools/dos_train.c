/* placeholder: being written */
extern int dos_placeholder_dos_train;
int main(void){return 0;}
