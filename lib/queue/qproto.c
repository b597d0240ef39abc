/*
 * qproto.c — encoding and decoding of the rl-queue wire header and fixed
 * parts, body (de)compression with size bounds, stage names.
 */
#include "queue/qproto.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/auth.h"

void
rl_qhdr_encode(uint8_t out[RL_QP_HDR_LEN], const rl_qhdr *h)
{
	memcpy(out, RL_QP_MAGIC, 4);
	out[4] = RL_QP_VERSION;
	out[5] = h->op;
	rl_le16_put(out + 6, h->flags);
	rl_le16_put(out + 8, h->hdr_len > RL_QP_HDR_LEN ? h->hdr_len : RL_QP_HDR_LEN);
	rl_le16_put(out + 10, h->status);
	rl_le32_put(out + 12, h->raw_len);
	rl_le64_put(out + 16, h->req_id);
	rl_le64_put(out + 24, h->arg);
}

int
rl_qhdr_decode(rl_qhdr *h, const void *msg, size_t len)
{
	const uint8_t *p = msg;

	memset(h, 0, sizeof *h);
	if (len < RL_QP_HDR_LEN || memcmp(p, RL_QP_MAGIC, 4) != 0)
		return RL_EFORMAT;
	h->version = p[4];
	h->op = p[5];
	h->flags = rl_le16_get(p + 6);
	h->hdr_len = rl_le16_get(p + 8);
	h->status = rl_le16_get(p + 10);
	h->raw_len = rl_le32_get(p + 12);
	h->req_id = rl_le64_get(p + 16);
	h->arg = rl_le64_get(p + 24);
	if (h->version != RL_QP_VERSION)
		return RL_EVERSION;
	if (h->hdr_len < RL_QP_HDR_LEN || h->hdr_len > len)
		return RL_EFORMAT;
	return RL_OK;
}

void
rl_qlease_req_encode(uint8_t out[RL_QLEASE_REQ_LEN], const rl_qlease_req *r)
{
	rl_le32_put(out, r->stage);
	rl_le32_put(out + 4, r->max_records);
	rl_le32_put(out + 8, r->wait_ms);
	rl_le32_put(out + 12, r->lease_ms);
	rl_le32_put(out + 16, r->group_hint);
	rl_le32_put(out + 20, r->min_records);
	rl_le64_put(out + 24, r->ack_lease);
}

void
rl_qlease_req_decode(rl_qlease_req *r, const uint8_t in[RL_QLEASE_REQ_LEN])
{
	r->stage = rl_le32_get(in);
	r->max_records = rl_le32_get(in + 4);
	r->wait_ms = rl_le32_get(in + 8);
	r->lease_ms = rl_le32_get(in + 12);
	r->group_hint = rl_le32_get(in + 16);
	r->min_records = rl_le32_get(in + 20);
	r->ack_lease = rl_le64_get(in + 24);
}

void
rl_qlease_info_encode(uint8_t out[RL_QLEASE_INFO_LEN], const rl_qlease_info *r)
{
	rl_le64_put(out, r->lease_id);
	rl_le64_put(out + 8, r->deadline_ms);
	rl_le64_put(out + 16, r->version);
	rl_le32_put(out + 24, r->n);
	rl_le32_put(out + 28, r->aborts);
}

void
rl_qlease_info_decode(rl_qlease_info *r, const uint8_t in[RL_QLEASE_INFO_LEN])
{
	r->lease_id = rl_le64_get(in);
	r->deadline_ms = rl_le64_get(in + 8);
	r->version = rl_le64_get(in + 16);
	r->n = rl_le32_get(in + 24);
	r->aborts = rl_le32_get(in + 28);
}

void
rl_qack_req_encode(uint8_t out[RL_QACK_REQ_LEN], const rl_qack_req *r)
{
	rl_le64_put(out, r->lease_id);
	rl_le32_put(out + 8, r->kind);
	rl_le32_put(out + 12, r->n);
}

void
rl_qack_req_decode(rl_qack_req *r, const uint8_t in[RL_QACK_REQ_LEN])
{
	r->lease_id = rl_le64_get(in);
	r->kind = rl_le32_get(in + 8);
	r->n = rl_le32_get(in + 12);
}

void
rl_qack_result_encode(uint8_t out[RL_QACK_RESULT_LEN], const rl_qack_result *r)
{
	rl_le32_put(out, r->done);
	rl_le32_put(out + 4, r->late);
	rl_le64_put(out + 8, r->deadline_ms);
}

void
rl_qack_result_decode(rl_qack_result *r, const uint8_t in[RL_QACK_RESULT_LEN])
{
	r->done = rl_le32_get(in);
	r->late = rl_le32_get(in + 4);
	r->deadline_ms = rl_le64_get(in + 8);
}

void
rl_qput_result_encode(uint8_t out[RL_QPUT_RESULT_LEN], const rl_qput_result *r)
{
	rl_le32_put(out, r->accepted);
	rl_le32_put(out + 4, r->duplicates);
	rl_le32_put(out + 8, r->replaced);
	rl_le32_put(out + 12, r->rejected);
}

void
rl_qput_result_decode(rl_qput_result *r, const uint8_t in[RL_QPUT_RESULT_LEN])
{
	r->accepted = rl_le32_get(in);
	r->duplicates = rl_le32_get(in + 4);
	r->replaced = rl_le32_get(in + 8);
	r->rejected = rl_le32_get(in + 12);
}

/* One decompression and one compression context per thread: creating them
 * per message costs more than compressing a small batch. */
static _Thread_local ZSTD_DCtx *tl_dctx;
static _Thread_local ZSTD_CCtx *tl_cctx;

int
rl_qbody_get(rl_buf *out, const rl_qhdr *h, const void *body, size_t blen, size_t max)
{
	unsigned long long csz;
	size_t r;
	int rv;

	if (!(h->flags & RL_QF_ZSTD)) {
		if (blen > max)
			return RL_ETOOBIG;
		return rl_buf_append(out, body, blen);
	}
	csz = ZSTD_getFrameContentSize(body, blen);
	if (csz == ZSTD_CONTENTSIZE_ERROR) {
		rl_error("message body is not a zstd frame");
		return RL_EFORMAT;
	}
	if (csz == ZSTD_CONTENTSIZE_UNKNOWN || csz != h->raw_len) {
		rl_error("zstd frame content size %llu does not match the header's %u",
		    csz == ZSTD_CONTENTSIZE_UNKNOWN ? 0ULL : csz, h->raw_len);
		return RL_EFORMAT;
	}
	if (csz > max) {
		rl_error("message body of %llu bytes is over the limit of %zu", csz, max);
		return RL_ETOOBIG;
	}
	if ((rv = rl_buf_reserve(out, (size_t)csz)) != 0)
		return rv;
	if (tl_dctx == NULL && (tl_dctx = ZSTD_createDCtx()) == NULL)
		return RL_ENOMEM;
	r = ZSTD_decompressDCtx(tl_dctx, out->p + out->len, (size_t)csz, body, blen);
	if (ZSTD_isError(r) || r != csz) {
		rl_error("cannot decompress message body: %s",
		    ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short frame");
		return RL_EFORMAT;
	}
	out->len += r;
	return RL_OK;
}

int
rl_qzstd_compress(rl_buf *out, const void *src, size_t n, int level)
{
	size_t bound = ZSTD_compressBound(n), r;
	int rv;

	if ((rv = rl_buf_reserve(out, bound)) != 0)
		return rv;
	if (tl_cctx == NULL) {
		if ((tl_cctx = ZSTD_createCCtx()) == NULL)
			return RL_ENOMEM;
	}
	ZSTD_CCtx_reset(tl_cctx, ZSTD_reset_session_and_parameters);
	ZSTD_CCtx_setParameter(tl_cctx, ZSTD_c_compressionLevel, level);
	ZSTD_CCtx_setParameter(tl_cctx, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(tl_cctx, ZSTD_c_contentSizeFlag, 1);
	r = ZSTD_compress2(tl_cctx, out->p + out->len, bound, src, n);
	if (ZSTD_isError(r)) {
		rl_error("zstd compression failed: %s", ZSTD_getErrorName(r));
		return RL_EIO;
	}
	out->len += r;
	return RL_OK;
}

static const char *const stage_names[RL_QSTAGE_COUNT] = { "prompt", "generated", "scored" };

const char *
rl_qstage_name(int stage)
{
	return stage >= 0 && stage < RL_QSTAGE_COUNT ? stage_names[stage] : "?";
}

int
rl_qstage_parse(const char *s)
{
	static const struct { const char *name; int stage; } names[] = {
		{ "prompt", RL_QSTAGE_PROMPT }, { "prompts", RL_QSTAGE_PROMPT }, { "rollout", RL_QSTAGE_PROMPT },
		{ "generated", RL_QSTAGE_GENERATED }, { "reward", RL_QSTAGE_GENERATED },
		{ "scored", RL_QSTAGE_SCORED }, { "train", RL_QSTAGE_SCORED },
	};
	for (size_t i = 0; i < RL_ARRAY_LEN(names); i++)
		if (strcmp(s, names[i].name) == 0)
			return names[i].stage;
	return -1;
}

const char *
rl_qop_name(int op)
{
	switch (op & 0x7f) {
	case RL_QOP_PING: return "ping";
	case RL_QOP_PUT: return "put";
	case RL_QOP_LEASE: return "lease";
	case RL_QOP_ACK: return "ack";
	case RL_QOP_VERSION: return "version";
	case RL_QOP_STAT: return "stat";
	case RL_QOP_REPORT: return "report";
	default: return "?";
	}
}

void
rl_qauth_sign(uint8_t *msg, size_t len, int tls)
{
	uint64_t t, nonce;

	rli_auth_stamp(&t, &nonce);
	rl_le64_put(msg + RL_QP_HDR_LEN, t);
	rl_le64_put(msg + RL_QP_HDR_LEN + 8, nonce);
	if (tls)
		rli_auth_seal_head(msg + RL_QP_HDR_LEN + 16, msg, RL_QP_HDR_LEN + 16);
	else
		rli_auth_seal(msg + RL_QP_HDR_LEN + 16, msg, RL_QP_HDR_LEN + 16, msg + RL_QP_AUTH_HDR_LEN,
		    len - RL_QP_AUTH_HDR_LEN);
}

int
rl_qauth_check(const uint8_t *msg, size_t len, const rl_qhdr *h, int tls, const char **why)
{
	uint8_t mac[RLI_AUTH_MAC_LEN];
	const uint8_t *got = msg + RL_QP_HDR_LEN + 16;
	int ok = 0;

	if (!rli_auth_key(NULL))
		return RL_OK;
	if (!(h->flags & RL_QF_AUTH) || h->hdr_len < RL_QP_AUTH_HDR_LEN || len < RL_QP_AUTH_HDR_LEN) {
		*why = "this broker requires a shared key: start the client with --auth-key-file (the same key as the "
		    "broker's; clients older than the key do not have the option)";
		return RL_EINVAL;
	}
	/* over TLS the header-only proof is the one expected: tried first */
	if (tls) {
		rli_auth_seal_head(mac, msg, RL_QP_HDR_LEN + 16);
		ok = rli_auth_equal(mac, got, sizeof mac);
	}
	if (!ok) {
		rli_auth_seal(mac, msg, RL_QP_HDR_LEN + 16, msg + RL_QP_AUTH_HDR_LEN, len - RL_QP_AUTH_HDR_LEN);
		ok = rli_auth_equal(mac, got, sizeof mac);
	}
	if (!ok) {
		*why = "wrong shared key: the request's MAC does not match this broker's --auth-key-file";
		if (!tls) {
			rli_auth_seal_head(mac, msg, RL_QP_HDR_LEN + 16);
			if (rli_auth_equal(mac, got, sizeof mac))
				*why = "the request's MAC covers its header only, as over tls+tcp:// where TLS protects the "
				    "body, but this broker listens on plain tcp:// and requires the body covered (a TLS "
				    "proxy in between? dial the broker's own URL)";
		}
		return RL_EINVAL;
	}
	return rli_auth_fresh(rl_le64_get(msg + RL_QP_HDR_LEN), rl_le64_get(msg + RL_QP_HDR_LEN + 8), why);
}
