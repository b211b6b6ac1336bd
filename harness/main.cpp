// mlagate entry point: everything happens in cli_main.
#include "harness/cli.h"

int main(int argc, char** argv) { return mlagate::cli_main(argc, argv); }
