/*
 * qhttp_page.c — the dashboard page, lib/queue/dashboard.html, built into
 * the program as rl_qhttp_page (NUL-terminated) with the assembler's
 * .incbin: the page stays one HTML file to read and edit, not C strings.
 * The path is relative to the directory make runs the compiler in (the
 * top of the tree); the Makefile makes this object depend on the file.
 */
#include "queue/qhttp.h"

__asm__(".section .rodata\n"
	".global rl_qhttp_page\n"
	".type rl_qhttp_page, @object\n"
	".balign 16\n"
	"rl_qhttp_page:\n"
	".incbin \"lib/queue/dashboard.html\"\n"
	".byte 0\n"
	".size rl_qhttp_page, . - rl_qhttp_page\n"
	".previous\n");
