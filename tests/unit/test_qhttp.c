/* test_qhttp.c — the HTTP listener's pure parts: --http address parsing and
 * the loopback rule, and the Prometheus rendering of a stats object
 * (histogram cumulation, labels, absent figures left out, bad JSON). */
#include <string.h>

#include "base/io.h"
#include "queue/qhttp.h"
#include "t.h"

static void
addr(const char *in, int want_rv, const char *want_url, int want_loop)
{
	char url[300];
	int loop = -1, rv = rl_qhttp_parse_addr(url, sizeof url, &loop, in);

	T_OK(rv == want_rv, "'%s': rv %d, expected %d", in, rv, want_rv);
	if (rv == 0 && want_rv == 0) {
		T_OK(strcmp(url, want_url) == 0, "'%s': url '%s', expected '%s'", in, url, want_url);
		T_OK(loop == want_loop, "'%s': loopback %d, expected %d", in, loop, want_loop);
	}
}

static int
has(const rl_buf *b, const char *line)
{
	size_t n = strlen(line);
	const char *p = (const char *)b->p, *end = p + b->len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
		if (len == n && memcmp(p, line, n) == 0)
			return 1;
		p += len + 1;
	}
	return 0;
}

int
main(void)
{
	rl_buf b;

	T_BEGIN("qhttp");
	addr("127.0.0.1:7480", 0, "http://127.0.0.1:7480", 1);
	addr("127.3.2.1:80", 0, "http://127.3.2.1:80", 1);
	addr("localhost:0", 0, "http://localhost:0", 1);
	addr(":9000", 0, "http://127.0.0.1:9000", 1);
	addr("http://127.0.0.1:9000/", 0, "http://127.0.0.1:9000", 1);
	addr("[::1]:9000", 0, "http://[::1]:9000", 1);
	addr("0.0.0.0:9000", 0, "http://0.0.0.0:9000", 0);
	addr("10.1.2.3:9000", 0, "http://10.1.2.3:9000", 0);
	addr("128.0.0.1:9000", 0, "http://128.0.0.1:9000", 0);
	addr("[::]:9000", 0, "http://[::]:9000", 0);
	addr("example.org:9000", 0, "http://example.org:9000", 0);
	addr("localhost.evil.example:1", 0, "http://localhost.evil.example:1", 0);
	addr("127.0.0.1", RL_EINVAL, NULL, 0);
	addr("127.0.0.1:", RL_EINVAL, NULL, 0);
	addr("127.0.0.1:65536", RL_EINVAL, NULL, 0);
	addr("127.0.0.1:-1", RL_EINVAL, NULL, 0);
	addr("127.0.0.1:80x", RL_EINVAL, NULL, 0);
	addr("127.0.0.1:80/metrics", RL_EINVAL, NULL, 0);
	addr("https://127.0.0.1:80", RL_EINVAL, NULL, 0);
	addr("tcp://127.0.0.1:80", RL_EINVAL, NULL, 0);
	addr("::1:80", RL_EINVAL, NULL, 0);
	addr("[::1]80", RL_EINVAL, NULL, 0);
	addr("[]:80", RL_EINVAL, NULL, 0);
	addr("user@127.0.0.1:80", RL_EINVAL, NULL, 0);
	addr("", RL_EINVAL, NULL, 0);
	{
		char small[8];
		int loop;
		T_EQ_INT(rl_qhttp_parse_addr(small, sizeof small, &loop, "127.0.0.1:1"), RL_ETOOBIG);
	}

	rl_buf_init(&b);
	T_EQ_INT(rl_qhttp_prometheus(&b,
	    "{\"version\":7,\"depth\":{\"prompt\":3,\"leased\":1},"
	    "\"total\":{\"put_prompt\":10,\"leased_train\":4,\"expired_leases\":2,\"stale_dropped\":5,\"stale_regenerated\":2,\"late_acks\":3},"
	    "\"staleness\":[4,0,2,0,0,0,0,0,1],\"staleness_sum\":13}"), RL_OK);
	T_OK(has(&b, "# TYPE rlqueue_trainer_version gauge"));
	T_OK(has(&b, "rlqueue_trainer_version 7"));
	T_OK(has(&b, "rlqueue_depth{state=\"prompt\"} 3"));
	T_OK(has(&b, "rlqueue_depth{state=\"leased\"} 1"));
	T_OK(!has(&b, "rlqueue_depth{state=\"scored\"} 0"), "absent figures are left out");
	T_OK(has(&b, "# TYPE rlqueue_put_records_total counter"));
	T_OK(has(&b, "rlqueue_put_records_total{kind=\"prompt\"} 10"));
	T_OK(has(&b, "rlqueue_leased_records_total{stage=\"train\"} 4"));
	T_OK(has(&b, "# HELP rlqueue_leased_records_total Records leased, by stage."));
	T_OK(has(&b, "rlqueue_lease_expiries_total 2"));
	T_OK(has(&b, "rlqueue_stale_dropped_total 5"));
	/* both count records (lib/queue/queue.c: stale_regen += nsamples, late_acks += ids), not groups or acks */
	T_OK(has(&b, "# HELP rlqueue_stale_regenerated_total Samples of stale groups dropped so that their prompt is generated again."));
	T_OK(has(&b, "# HELP rlqueue_late_acks_total Records acknowledged after their lease expired or no longer held them."));
	T_OK(has(&b, "# TYPE rlqueue_staleness histogram"));
	T_OK(has(&b, "rlqueue_staleness_bucket{le=\"0\"} 4"));
	T_OK(has(&b, "rlqueue_staleness_bucket{le=\"1\"} 4"));
	T_OK(has(&b, "rlqueue_staleness_bucket{le=\"2\"} 6"));
	T_OK(has(&b, "rlqueue_staleness_bucket{le=\"7\"} 6"));
	T_OK(has(&b, "rlqueue_staleness_bucket{le=\"+Inf\"} 7"));
	T_OK(!has(&b, "rlqueue_staleness_bucket{le=\"8\"} 7"));
	T_OK(has(&b, "rlqueue_staleness_sum 13"));
	T_OK(has(&b, "rlqueue_staleness_count 7"));
	T_OK(!has(&b, "# TYPE rlqueue_journal_bytes gauge"), "no journal: no journal metrics");
	T_OK(b.len > 0 && b.p[b.len - 1] == '\n');
	rl_buf_reset(&b);
	T_EQ_INT(rl_qhttp_prometheus(&b, "{\"version\":"), RL_EFORMAT);
	T_EQ_INT(rl_qhttp_prometheus(&b, "[1,2]"), RL_EFORMAT);
	T_EQ_INT(rl_qhttp_prometheus(&b, ""), RL_EFORMAT);
	T_EQ_INT(b.len, 0);
	rl_buf_fini(&b);

	T_OK(strstr(rl_qhttp_page, "<canvas") != NULL && strstr(rl_qhttp_page, "api/stats") != NULL);
	T_OK(strstr(rl_qhttp_page, "http://") == NULL && strstr(rl_qhttp_page, "https://") == NULL);
	T_END();
}
