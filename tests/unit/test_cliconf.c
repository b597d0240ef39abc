/* test_cliconf.c — run files (base/conf.h) and --config (base/cli.h): the
 * file's options come before the command line's, so the command line wins;
 * unknown keys, wrong types and bad values are refused naming file, line and
 * key; the reader's entries, values and 1-based lines. */
#include "base/cli.h"
#include "base/conf.h"
#include "t.h"

#include <unistd.h>

enum { O_LR = 256, O_NAME, O_FLAG, O_TASK, O_OPT };

static const struct option longopts[] = {
	{"lr", required_argument, NULL, O_LR},
	{"name", required_argument, NULL, O_NAME},
	{"flag", no_argument, NULL, O_FLAG},
	{"task", required_argument, NULL, O_TASK},
	{"watch", optional_argument, NULL, O_OPT},
	{"quiet", no_argument, NULL, 'q'},
	{NULL, 0, NULL, 0},
};

static char msg[2048], path[64];

typedef struct parsed {
	double lr;
	const char *name, *tasks[4], *watch;
	int flag, quiet, ntask, watch_set;
} parsed;

static void
write_file(const char *text)
{
	FILE *f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

/* The parse loop of a command; returns 0 or the usage-error status. */
static int
parse(parsed *p, int argc, char **argv)
{
	int c, rv;

	memset(p, 0, sizeof *p);
	rl_cli_init("rl-test", longopts);
	static const char *const lists[] = { "task", NULL };
	rl_cli_repeatable(lists);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	optind = 1;
	while ((c = rl_cli_getopt(argc, argv, "q", NULL)) != -1) {
		switch (c) {
		case O_LR: if ((rv = rl_cli_double(c, optarg, 0, 1, &p->lr)) != 0) return rv; break;
		case O_NAME: p->name = optarg; break;
		case O_FLAG: p->flag = 1; break;
		case O_TASK: if (p->ntask < 4) p->tasks[p->ntask++] = optarg; break;
		case O_OPT: p->watch_set = 1; p->watch = optarg; break;
		case 'q': p->quiet = 1; break;
		default: return 2;   /* getopt_long said what was wrong */
		}
	}
	if (optind < argc && strcmp(argv[optind], "pos") != 0)
		return rl_cli_usage("unexpected '%s'", argv[optind]);
	return 0;
}

#define ARGV(...) ((char *[]){ "rl-test", __VA_ARGS__, NULL })
#define ARGC(...) ((int)(sizeof((char *[]){ "rl-test", __VA_ARGS__ }) / sizeof(char *)))
#define PARSE(p, ...) parse((p), ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

int
main(void)
{
	parsed p;
	int rv;

	T_BEGIN("test_cliconf");
	rl_log_init("rl-test", 0);
	snprintf(path, sizeof path, "/tmp/test_cliconf.%d.yaml", (int)getpid());

	/* precedence: the file's values, the command line's over them, on either
	 * side of --config; lists for repeatable options; false switches off */
	write_file("# a run\nlr: 0.25\nname: from-file\nflag: true\nquiet: false\ntask: [a, 'b c']\nwatch:\n");
	T_EQ_INT(PARSE(&p, "--config", path), 0);
	T_OK(p.lr == 0.25);
	T_EQ_STR(p.name, "from-file");
	T_OK(p.flag == 1 && p.quiet == 0);
	T_EQ_INT(p.ntask, 2);
	T_EQ_STR(p.tasks[1], "b c");
	T_OK(p.watch_set && p.watch == NULL, "an optional argument given no value");
	T_EQ_INT(PARSE(&p, "--lr", "0.5", "--config", path, "--name=cli", "pos"), 0);
	T_OK(p.lr == 0.5, "%g: the command line wins over the file", p.lr);
	T_EQ_STR(p.name, "cli");
	T_EQ_INT(PARSE(&p, "--config=/dev/null", "-q"), 0);
	T_OK(p.quiet && p.lr == 0, "an empty file is no options");
	T_EQ_INT(PARSE(&p, "pos", "--", "--config", "x"), 0);   /* after -- it is an operand, not read */

	/* unknown key: file, line and key */
	write_file("lr: 0.1\n\nlrr: 0.2\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "line 3: unknown key 'lrr'") && strstr(msg, path), "%s", msg);
	/* wrong types */
	write_file("flag: maybe\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "line 1: key 'flag': wrong type"), "%s", msg);
	write_file("name: x\nlr:\n  a: 1\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "line 3: key 'lr': wrong type"), "%s", msg);
	write_file("lr: [0.1, 0.2]\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "key 'lr': wrong type: a list"), "%s", msg);
	write_file("name:\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "line 1: key 'name': no value"), "%s", msg);
	/* a bad value from the file: the value parser's message, file and line */
	write_file("name: a\n\n\nlr: 1.5\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_EQ_INT(rv, 2);
	T_OK(strstr(msg, "line 4: --lr: bad value '1.5'"), "%s", msg);
	/* the same bad value on the command line: no file named */
	T_CAPTURE(PARSE(&p, "--config", path, "--lr", "2"), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "line 4"), "the file's value is checked too: %s", msg);
	write_file("name: a\n");
	T_CAPTURE(PARSE(&p, "--config", path, "--lr", "2"), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "--lr: bad value '2'") && !strstr(msg, "line"), "%s", msg);
	/* not a mapping, not YAML, twice, missing */
	write_file("- lr\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "line 1: want a mapping"), "%s", msg);
	write_file("lr: 0.1\nname: [x\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "not YAML"), "%s", msg);
	write_file("lr: 0.1\nlr: 0.2\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "line 2: key 'lr' given twice (first on line 1)"), "%s", msg);
	T_CAPTURE(PARSE(&p, "--config", path, "--config", path), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "given twice"), "%s", msg);
	T_CAPTURE(PARSE(&p, "--config", "/nonexistent/run.yaml"), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "'/nonexistent/run.yaml'"), "%s", msg);
	T_CAPTURE(PARSE(&p, "--config"), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "--config: needs a FILE"), "%s", msg);
	write_file("config: other.yaml\n");
	T_CAPTURE(PARSE(&p, "--config", path), &rv, msg);
	T_OK(rv == 2 && strstr(msg, "unknown key 'config'"), "%s", msg);

	/* the reader alone: entries in file order with their lines */
	{
		rl_conf c = { 0 };
		write_file("a: 1\nb: 'x: y'\nc: ~\nd:\n  - p\n  - q\ne: {k: v}\n");
		T_EQ_INT(rl_conf_read(&c, path), 0);
		T_EQ_INT(c.n, 6);
		if (c.n == 6) {
			T_EQ_STR(c.e[1].val, "x: y");
			T_EQ_INT(c.e[2].type, RL_CONF_NULL);
			T_OK(c.e[3].in_seq && c.e[3].line == 5 && c.e[4].line == 6);
			T_EQ_STR(c.e[4].val, "q");
			T_EQ_INT(c.e[5].type, RL_CONF_MAPPING);
			T_EQ_INT(c.e[5].line, 7);
		}
		rl_conf_fini(&c);
	}
	unlink(path);
	T_END();
}
