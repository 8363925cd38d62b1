/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  RFC 8785 (JSON Canonicalization Scheme) serialization of jsonb, and the
 *	  SHA-256 request fingerprint built on it.
 *
 * The serializer walks the binary jsonb containers directly (the JEntry
 * layout documented in utils/jsonb.h) instead of going through jsonb's text
 * output or JsonbIterator: that costs no allocation per value, and the
 * members of each object can be re-sorted in place, by UTF-16 code units as
 * RFC 8785 requires (jsonb itself keeps keys sorted by length, then bytes).
 *
 * Numbers follow ECMAScript's Number::toString of the nearest IEEE 754
 * double.  A numeric with at most 15 significant digits in the normal double
 * range is its own shortest round-trip form (DBL_DIG is 15), so it is
 * written straight from its base-10000 digits.  Anything longer goes through
 * strtod (correctly rounded), PostgreSQL's shortest-digits double output, and
 * a fix-up for the interval ends that output never picks (CanonTryBoundary).
 * A number beyond the double range is ERROR 22003 (JSON.parse would make it
 * Infinity, which JSON cannot carry); one below half the smallest subnormal
 * becomes 0, as JSON.parse makes it.
 *
 * Strings are written in the database encoding.  idem_canonical returns that
 * text; idem_hash converts it to UTF-8 before hashing, so both functions mean
 * the same characters in every database.  Keys are compared in UTF-8 (code
 * point order, with the surrogate fix-up below), converted first in
 * databases that are not UTF8.  In SQL_ASCII databases the bytes must be
 * valid UTF-8 or the call fails: we never hash bytes we cannot interpret.
 *
 * idem_hash streams: the output buffer is hashed and emptied every
 * CANON_FLUSH_BYTES, so its memory is bounded by the nesting depth and the
 * widest object rather than the document (which the caller has detoasted).
 * Everything is allocated in the caller's memory context and freed before
 * returning, except the backend's one OpenSSL digest context, which lives
 * as long as the backend and is initialized again for every hash, so an
 * error midway leaves nothing to free (CanonSha256Begin).  No locks are
 * taken.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <float.h>
#include <math.h>

#ifdef USE_OPENSSL
#include <openssl/evp.h>
#endif

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "common/shortest_dec.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_canonical);
PG_FUNCTION_INFO_V1(idem_hash);

/* idem_hash hashes and empties its output buffer when it grows past this */
#define CANON_FLUSH_BYTES		(64 * 1024)

/* Strings up to this many bytes are escaped into space reserved up front */
#define CANON_SHORT_STRING		1024

/* Objects up to this many members are sorted by insertion sort */
#define CANON_INSERTION_SORT_MAX	16

/*
 * The on-disk numeric format (numeric.c; fixed since 9.1 by pg_upgrade
 * compatibility): a uint16 header word, for the long form an int16 weight,
 * then base-10000 digits, most significant first.
 */
#define CANON_NBASE					10000
#define CANON_NUMERIC_FLAGMASK		0xC000
#define CANON_NUMERIC_NEG			0x4000
#define CANON_NUMERIC_SHORT			0x8000
#define CANON_NUMERIC_SPECIAL		0xC000
#define CANON_NUMERIC_SHORT_SIGN	0x2000
#define CANON_NUMERIC_SHORT_WSIGN	0x0040
#define CANON_NUMERIC_SHORT_WMASK	0x003F

/*
 * Decimal exponents (value = 0.DIGITS * 10^n) within which a number of at
 * most DBL_DIG significant digits is a normal double that prints back as
 * the same digits.  Outside, the slow path decides.
 */
#define CANON_FAST_MIN_EXP			(-290)
#define CANON_FAST_MAX_EXP			300

/*
 * A SHA-256 computation.  With OpenSSL (every PostgreSQL that Debian
 * ships), the digest is OpenSSL's, called directly: pg_cryptohash_init
 * passes EVP_sha256(), which OpenSSL 3 fetches from its provider again on
 * every init, and that fetch cost more than hashing a small request.
 * Without OpenSSL, PostgreSQL's own (src/common/sha2.c) through
 * pg_cryptohash, whose context is palloc'd.
 */
typedef struct CanonSha256
{
#ifdef USE_OPENSSL
	EVP_MD_CTX *ctx;
#else
	pg_cryptohash_ctx *ctx;
#endif
} CanonSha256;

/* An object member waiting to be written in sorted order */
typedef struct CanonMember
{
	const char *key;			/* key bytes, database encoding */
	const char *sortkey;		/* the key in UTF-8 (usually == key) */
	uint32		keylen;
	uint32		sortlen;
	JEntry		entry;			/* the value's JEntry */
	uint32		valuelen;
	const char *value;			/* the value's data, aligned as jsonb does */
} CanonMember;

/* The state of one serialization */
typedef struct CanonState
{
	StringInfoData out;			/* canonical text, database encoding */
	CanonMember *members;		/* stack of members of the open objects */
	int			nmembers;
	int			maxmembers;
	int			encoding;		/* database encoding */
	CanonSha256 *hash;			/* non-NULL: hash and flush as we go */
} CanonState;

/* For each byte, 0 when written as is, else the letter after the backslash */
static const char canon_escape[256] = {
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u',
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	0, 0, '"', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '\\', 0, 0, 0,
	/* the rest, 0x60 to 0xFF, is zero */
};

static const char canon_hexdigits[] = "0123456789abcdef";

static void CanonContainer(CanonState *st, const JsonbContainer *c);
pg_noreturn static void CanonNumberOutOfRange(bool negative, const char *digits,
											  int k, int n);

/* Write the decimal form of an int at p (no NUL); returns its length */
static int
CanonItoa(int value, char *p)
{
	char		tmp[12];
	int			len = 0;
	int			i;
	unsigned int u = value < 0 ? -(unsigned int) value : (unsigned int) value;

	do
	{
		tmp[len++] = '0' + u % 10;
		u /= 10;
	} while (u > 0);
	i = 0;
	if (value < 0)
		p[i++] = '-';
	while (len > 0)
		p[i++] = tmp[--len];
	return i;
}

#ifdef USE_OPENSSL
/*
 * The backend's SHA-256 digest, fetched once, and its one digest context,
 * initialized again for every hash: both are OpenSSL's memory, not
 * PostgreSQL's, and live as long as the backend, so that no transaction,
 * resource owner or error touches them.  Hashes never nest, and one that an
 * error left unfinished is simply initialized again by the next.
 */
static EVP_MD *canon_sha256_md = NULL;
static EVP_MD_CTX *canon_sha256_ctx = NULL;

/* Start a SHA-256 computation */
static void
CanonSha256Begin(CanonSha256 *h)
{
	if (canon_sha256_md == NULL)
	{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
		canon_sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
		canon_sha256_md = (EVP_MD *) EVP_sha256();
#endif
		if (canon_sha256_md == NULL)
			elog(ERROR, "could not fetch the SHA-256 digest of OpenSSL");
	}
	if (canon_sha256_ctx == NULL)
	{
		canon_sha256_ctx = EVP_MD_CTX_new();
		if (canon_sha256_ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
	h->ctx = canon_sha256_ctx;
	if (EVP_DigestInit_ex(h->ctx, canon_sha256_md, NULL) != 1)
		elog(ERROR, "could not initialize SHA-256 context");
}

/* Add bytes to a SHA-256 computation */
static void
CanonSha256Add(CanonSha256 *h, const char *data, size_t len)
{
	if (EVP_DigestUpdate(h->ctx, data, len) != 1)
		elog(ERROR, "could not update SHA-256 context");
}

/* Finish a SHA-256 computation into dest (PG_SHA256_DIGEST_LENGTH bytes) */
static void
CanonSha256End(CanonSha256 *h, uint8 *dest)
{
	unsigned int len;

	if (EVP_DigestFinal_ex(h->ctx, dest, &len) != 1 ||
		len != PG_SHA256_DIGEST_LENGTH)
		elog(ERROR, "could not finalize SHA-256 context");
}
#else							/* !USE_OPENSSL */
/*
 * Without OpenSSL, a context per hash, palloc'd in the caller's memory
 * context (it holds no other resource), freed with it on an error
 */

/* Start a SHA-256 computation */
static void
CanonSha256Begin(CanonSha256 *h)
{
	h->ctx = pg_cryptohash_create(PG_SHA256);
	if (h->ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (pg_cryptohash_init(h->ctx) < 0)
		elog(ERROR, "could not initialize SHA-256 context");
}

/* Add bytes to a SHA-256 computation */
static void
CanonSha256Add(CanonSha256 *h, const char *data, size_t len)
{
	if (pg_cryptohash_update(h->ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update SHA-256 context");
}

/* Finish a SHA-256 computation into dest (PG_SHA256_DIGEST_LENGTH bytes) */
static void
CanonSha256End(CanonSha256 *h, uint8 *dest)
{
	if (pg_cryptohash_final(h->ctx, dest, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize SHA-256 context: %s",
			 pg_cryptohash_error(h->ctx));
	pg_cryptohash_free(h->ctx);
}
#endif							/* USE_OPENSSL */

/* Is every byte of s[0..len) ASCII? */
static inline bool
CanonIsAscii(const char *s, uint32 len)
{
	uint32		i;

	for (i = 0; i < len; i++)
	{
		if (IS_HIGHBIT_SET(s[i]))
			return false;
	}
	return true;
}

/* Hash what the output buffer holds, in UTF-8, and empty it */
static void
CanonFlush(CanonState *st)
{
	const char *data = st->out.data;
	size_t		len = st->out.len;

	if (len == 0)
		return;
	if (st->encoding != PG_UTF8)
	{
		/* converts, or in SQL_ASCII checks that the bytes are UTF-8 */
		data = pg_server_to_any(st->out.data, st->out.len, PG_UTF8);
		if (data != st->out.data)
			len = strlen(data);
	}
	CanonSha256Add(st->hash, data, len);
	if (data != st->out.data)
		pfree((char *) data);
	resetStringInfo(&st->out);
}

/*
 * Flush when hashing and the buffer is big.  Called only between tokens, so
 * a flush never splits a character (database encodings are ASCII-safe).
 */
static inline void
CanonMaybeFlush(CanonState *st)
{
	if (st->hash != NULL && st->out.len >= CANON_FLUSH_BYTES)
		CanonFlush(st);
}

/*
 * Write a JSON string: only '"', '\' and U+0000..U+001F are escaped.  Short
 * strings (most keys and values) get room for the worst case up front and
 * are copied byte by byte; long ones are copied in runs between escapes, so
 * that they never need more than their final size.
 */
static void
CanonString(StringInfo out, const char *s, uint32 len)
{
	const unsigned char *p = (const unsigned char *) s;
	const unsigned char *end = p + len;

	if (len <= CANON_SHORT_STRING)
	{
		char	   *dst;

		/* every byte could become \u00XX */
		enlargeStringInfo(out, len * 6 + 2);
		dst = out->data + out->len;
		*dst++ = '"';
		for (; p < end; p++)
		{
			char		esc = canon_escape[*p];

			if (likely(esc == 0))
			{
				*dst++ = *p;
				continue;
			}
			*dst++ = '\\';
			*dst++ = esc;
			if (esc == 'u')
			{
				*dst++ = '0';
				*dst++ = '0';
				*dst++ = canon_hexdigits[*p >> 4];
				*dst++ = canon_hexdigits[*p & 0xF];
			}
		}
		*dst++ = '"';
		*dst = '\0';
		out->len = dst - out->data;
	}
	else
	{
		const unsigned char *run = p;

		/* the common case, nothing to escape, needs exactly len + 2 bytes */
		enlargeStringInfo(out, len + 2);
		appendStringInfoCharMacro(out, '"');
		for (; p < end; p++)
		{
			char		esc = canon_escape[*p];

			if (likely(esc == 0))
				continue;
			if (p > run)
				appendBinaryStringInfo(out, (const char *) run, p - run);
			if (esc == 'u')
			{
				char		buf[6] = {'\\', 'u', '0', '0',
				canon_hexdigits[*p >> 4], canon_hexdigits[*p & 0xF]};

				appendBinaryStringInfo(out, buf, 6);
			}
			else
			{
				char		buf[2] = {'\\', esc};

				appendBinaryStringInfo(out, buf, 2);
			}
			run = p + 1;
		}
		if (end > run)
			appendBinaryStringInfo(out, (const char *) run, end - run);
		appendStringInfoCharMacro(out, '"');
	}
}

/*
 * Write a number given as its significant decimal digits (k of them, no
 * leading or trailing zeros) and exponent n, value = 0.DIGITS * 10^n, the
 * way ECMAScript's Number::toString does (ECMA-262, 6.1.6.1.20).
 */
static void
CanonEcmaNumber(StringInfo out, bool negative, const char *digits, int k, int n)
{
	char	   *p;
	int			e;

	/* every form here takes at most 26 bytes: write in place */
	enlargeStringInfo(out, 48);
	p = out->data + out->len;
	if (negative)
		*p++ = '-';
	if (k <= n && n <= 21)
	{
		/* an integer: the digits, then n - k zeros */
		memcpy(p, digits, k);
		p += k;
		memset(p, '0', n - k);
		p += n - k;
	}
	else if (0 < n && n <= 21)
	{
		/* a decimal point inside the digits */
		memcpy(p, digits, n);
		p += n;
		*p++ = '.';
		memcpy(p, digits + n, k - n);
		p += k - n;
	}
	else if (-6 < n && n <= 0)
	{
		/* 0.000ddd */
		*p++ = '0';
		*p++ = '.';
		memset(p, '0', -n);
		p += -n;
		memcpy(p, digits, k);
		p += k;
	}
	else
	{
		/* d.ddde+x or de-x */
		*p++ = digits[0];
		if (k > 1)
		{
			*p++ = '.';
			memcpy(p, digits + 1, k - 1);
			p += k - 1;
		}
		*p++ = 'e';
		e = n - 1;
		if (e >= 0)
			*p++ = '+';
		else
		{
			*p++ = '-';
			e = -e;
		}
		p += CanonItoa(e, p);
	}
	*p = '\0';
	out->len = p - out->data;
}

/*
 * Report a number beyond the double range.  digits/k/n as for
 * CanonEcmaNumber; the message shows at most 17 significant digits.
 */
static void
CanonNumberOutOfRange(bool negative, const char *digits, int k, int n)
{
	StringInfoData shown;
	int			show = Min(k, 17);

	initStringInfo(&shown);
	if (negative)
		appendStringInfoChar(&shown, '-');
	appendStringInfoChar(&shown, digits[0]);
	if (show > 1)
	{
		appendStringInfoChar(&shown, '.');
		appendBinaryStringInfo(&shown, digits + 1, show - 1);
	}
	if (show < k)
		appendStringInfoString(&shown, "...");
	appendStringInfo(&shown, "e+%d", n - 1);
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("number %s is out of range for canonical JSON", shown.data),
			 errdetail("RFC 8785 represents numbers as IEEE 754 double precision values, whose magnitude is at most 1.7976931348623157e+308.")));
}

/* Does DIGITS (k of them) * 10^(n - k) read back as exactly d (d > 0)? */
static bool
CanonDigitsAre(const char *digits, int k, int n, double d)
{
	char		buf[DOUBLE_SHORTEST_DECIMAL_LEN + 16];
	char	   *p = buf;

	memcpy(p, digits, k);
	p += k;
	*p++ = 'e';
	p += CanonItoa(n - k, p);
	*p = '\0';
	return strtod(buf, NULL) == d;
}

/*
 * PostgreSQL's shortest-digits output (Ryu built without STRICTLY_SHORTEST)
 * only considers decimals strictly inside the interval that rounds to d.
 * ECMAScript also takes an interval end when it rounds to d (a tie to an
 * even mantissa): 1e23 is "1e+23" there, not "9.999999999999999e+22".
 * Such an end, if shorter, lies on the grid of k - 1 digits, so it is one
 * of the two neighbours of DIGITS at k - 1 digits; at most one of them can
 * qualify.  Rewrites digits/k/n in place when it does.
 */
static void
CanonTryBoundary(char *digits, int *k, int *n, double d)
{
	char		up[DOUBLE_SHORTEST_DECIMAL_LEN + 1];
	int			len = *k - 1;
	int			upn = *n;
	int			i;

	if (len < 1)
		return;
	if (CanonDigitsAre(digits, len, *n, d))
	{
		*k = len;
	}
	else
	{
		/* DIGITS[0..len) plus one unit in the last place, carrying */
		memcpy(up, digits, len);
		for (i = len - 1; i >= 0 && up[i] == '9'; i--)
			up[i] = '0';
		if (i >= 0)
			up[i]++;
		else
		{
			memmove(up + 1, up, len);
			up[0] = '1';
			upn++;
			len++;
		}
		if (!CanonDigitsAre(up, len, upn, d))
			return;
		memcpy(digits, up, len);
		*k = len;
		*n = upn;
	}
	while (*k > 1 && digits[*k - 1] == '0')
		(*k)--;
}

/*
 * Write a finite double the ECMAScript way, from PostgreSQL's shortest
 * round-trip digits (whose notation, fixed or exponent, we parse and redo).
 */
static void
CanonDouble(StringInfo out, double d)
{
	char		buf[DOUBLE_SHORTEST_DECIMAL_LEN];
	char		digits[DOUBLE_SHORTEST_DECIMAL_LEN + 1];
	const char *p = buf;
	bool		negative = false;
	int			k = 0;
	int			n = 0;
	int			lead;

	if (d == 0)
	{
		/* underflow and -0 both end here */
		appendStringInfoChar(out, '0');
		return;
	}
	double_to_shortest_decimal_buf(d, buf);
	if (*p == '-')
	{
		negative = true;
		p++;
	}
	for (; *p >= '0' && *p <= '9'; p++)
	{
		digits[k++] = *p;
		n++;
	}
	if (*p == '.')
	{
		for (p++; *p >= '0' && *p <= '9'; p++)
			digits[k++] = *p;
	}
	if (*p == 'e' || *p == 'E')
		n += atoi(p + 1);

	/* drop leading zeros ("0.0001"), then trailing ones ("100") */
	for (lead = 0; lead < k && digits[lead] == '0'; lead++)
		n--;
	memmove(digits, digits + lead, k - lead);
	k -= lead;
	while (k > 1 && digits[k - 1] == '0')
		k--;
	Assert(k > 0);
	CanonTryBoundary(digits, &k, &n, fabs(d));
	CanonEcmaNumber(out, negative, digits, k, n);
}

/* Write the decimal digits of one base-10000 digit, exactly four */
static inline char *
CanonNbaseDigits(char *p, int d)
{
	p[0] = '0' + d / 1000;
	p[1] = '0' + (d / 100) % 10;
	p[2] = '0' + (d / 10) % 10;
	p[3] = '0' + d % 10;
	return p + 4;
}

/*
 * Write a jsonb numeric as the ECMAScript form of its nearest double.  Not
 * inlined: its digit buffer would otherwise sit in CanonValue's frame, once
 * per level of nesting.
 */
static pg_noinline void
CanonNumeric(StringInfo out, const char *num)
{
	const char *data = VARDATA_ANY(num);
	size_t		size = VARSIZE_ANY_EXHDR(num);
	uint16		header;
	int			weight;
	bool		negative;
	const char *nbase;			/* int16 digits, possibly unaligned */
	int			ndigits;
	int			first;
	int16		d;
	char		stackbuf[64];
	char	   *buf;
	char	   *p;
	int			lead;
	int			k;
	int			n;
	int			i;

	memcpy(&header, data, sizeof(uint16));
	if ((header & CANON_NUMERIC_FLAGMASK) == CANON_NUMERIC_SHORT)
	{
		negative = (header & CANON_NUMERIC_SHORT_SIGN) != 0;
		weight = header & CANON_NUMERIC_SHORT_WMASK;
		if (header & CANON_NUMERIC_SHORT_WSIGN)
			weight |= ~CANON_NUMERIC_SHORT_WMASK;
		nbase = data + sizeof(uint16);
	}
	else if ((header & CANON_NUMERIC_FLAGMASK) == CANON_NUMERIC_SPECIAL)
	{
		/* jsonb does not accept NaN or infinities; never write one */
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("number %s is out of range for canonical JSON",
						numeric_normalize((Numeric) num))));
	}
	else
	{
		int16		w;

		negative = (header & CANON_NUMERIC_FLAGMASK) == CANON_NUMERIC_NEG;
		memcpy(&w, data + sizeof(uint16), sizeof(int16));
		weight = w;
		nbase = data + sizeof(uint16) + sizeof(int16);
	}
	ndigits = (size - (nbase - data)) / sizeof(int16);

	/* numeric stores no zero digits at either end, but do not rely on it */
	for (first = 0; first < ndigits; first++)
	{
		memcpy(&d, nbase + first * sizeof(int16), sizeof(int16));
		if (d != 0)
			break;
		weight--;
	}
	for (; ndigits > first; ndigits--)
	{
		memcpy(&d, nbase + (ndigits - 1) * sizeof(int16), sizeof(int16));
		if (d != 0)
			break;
	}
	if (ndigits == first)
	{
		appendStringInfoChar(out, '0');
		return;
	}

	/* The decimal digits, four per base-10000 digit, plus room for "e-NNNNN" */
	if ((ndigits - first) * 4 + 16 <= (int) sizeof(stackbuf))
		buf = stackbuf;
	else
		buf = palloc((ndigits - first) * 4 + 16);
	p = buf;
	for (i = first; i < ndigits; i++)
	{
		memcpy(&d, nbase + i * sizeof(int16), sizeof(int16));
		Assert(d >= 0 && d < CANON_NBASE);
		p = CanonNbaseDigits(p, d);
	}
	for (lead = 0; buf[lead] == '0'; lead++)
		;
	k = (p - buf) - lead;
	while (buf[lead + k - 1] == '0')
		k--;
	/* value = 0.DIGITS * 10^n */
	n = (weight + 1) * 4 - lead;

	if (k <= DBL_DIG && n > CANON_FAST_MIN_EXP && n < CANON_FAST_MAX_EXP)
	{
		/* its own shortest round-trip form */
		CanonEcmaNumber(out, negative, buf + lead, k, n);
	}
	else if (n > DBL_MAX_10_EXP + 1)
	{
		/* at least 10^309 */
		CanonNumberOutOfRange(negative, buf + lead, k, n);
	}
	else if (n < -325)
	{
		/* below 10^-325, less than half the smallest subnormal: 0 */
		appendStringInfoChar(out, '0');
	}
	else
	{
		char	   *digits = buf + lead;
		double		value;

		/* "DIGITS" "e" (n - k) for a correctly rounded strtod */
		memmove(buf, digits, k);
		p = buf + k;
		*p++ = 'e';
		p += CanonItoa(n - k, p);
		*p = '\0';
		value = strtod(buf, NULL);
		if (isinf(value))
		{
			buf[k] = '\0';
			CanonNumberOutOfRange(negative, buf, k, n);
		}
		CanonDouble(out, negative ? -value : value);
	}
	if (buf != stackbuf)
		pfree(buf);
}

/* Write one value given by its JEntry and (aligned) data */
static void
CanonValue(CanonState *st, JEntry entry, const char *data, uint32 len)
{
	switch (entry & JENTRY_TYPEMASK)
	{
		case JENTRY_ISSTRING:
			CanonString(&st->out, data, len);
			break;
		case JENTRY_ISNUMERIC:
			CanonNumeric(&st->out, data);
			break;
		case JENTRY_ISBOOL_FALSE:
			appendBinaryStringInfo(&st->out, "false", 5);
			break;
		case JENTRY_ISBOOL_TRUE:
			appendBinaryStringInfo(&st->out, "true", 4);
			break;
		case JENTRY_ISNULL:
			appendBinaryStringInfo(&st->out, "null", 4);
			break;
		case JENTRY_ISCONTAINER:
			CanonContainer(st, (const JsonbContainer *) data);
			break;
		default:
			elog(ERROR, "unrecognized jsonb entry type 0x%x",
				 entry & JENTRY_TYPEMASK);
	}
}

/* Where a child's data starts: numerics and containers are int-aligned */
static inline const char *
CanonChildData(const char *base, JEntry entry, uint32 offset)
{
	if (JBE_ISNUMERIC(entry) || JBE_ISCONTAINER(entry))
		return base + INTALIGN(offset);
	return base + offset;
}

/*
 * Compare two UTF-8 keys in UTF-16 code unit order.  That is byte order
 * except where a supplementary character (4-byte UTF-8, a surrogate pair in
 * UTF-16, 0xD800..) meets one of U+E000..U+FFFF (lead byte 0xEE or 0xEF):
 * there UTF-16 puts the supplementary character first.
 */
static inline int
CanonKeyCmp(const CanonMember *a, const CanonMember *b)
{
	const unsigned char *s = (const unsigned char *) a->sortkey;
	const unsigned char *t = (const unsigned char *) b->sortkey;
	uint32		len = Min(a->sortlen, b->sortlen);
	uint32		i;

	for (i = 0; i < len; i++)
	{
		unsigned char c = s[i];
		unsigned char e = t[i];

		if (c == e)
			continue;
		/*
		 * The prefixes are equal, so both bytes start a character or both
		 * continue one with the same lead byte; only two lead bytes of
		 * 0xEE or more can disagree with code unit order.
		 */
		if (c >= 0xEE && e >= 0xEE)
		{
			if (c >= 0xF0 && e < 0xF0)
				return -1;
			if (e >= 0xF0 && c < 0xF0)
				return 1;
		}
		return c < e ? -1 : 1;
	}
	if (a->sortlen == b->sortlen)
		return 0;
	return a->sortlen < b->sortlen ? -1 : 1;
}

/* qsort wrapper around CanonKeyCmp */
static int
CanonKeyQsortCmp(const void *a, const void *b)
{
	return CanonKeyCmp((const CanonMember *) a, (const CanonMember *) b);
}

/* Sort n members by key */
static void
CanonSortMembers(CanonMember *m, int n)
{
	int			i;
	int			j;

	if (n > CANON_INSERTION_SORT_MAX)
	{
		qsort(m, n, sizeof(CanonMember), CanonKeyQsortCmp);
		return;
	}
	for (i = 1; i < n; i++)
	{
		CanonMember tmp = m[i];

		for (j = i; j > 0 && CanonKeyCmp(&tmp, &m[j - 1]) < 0; j--)
			m[j] = m[j - 1];
		m[j] = tmp;
	}
}

/* Write an object, members sorted by UTF-16 code units */
static void
CanonObject(CanonState *st, const JsonbContainer *c)
{
	uint32		n = JsonContainerSize(c);
	const char *base = (const char *) &c->children[n * 2];
	int			first = st->nmembers;
	uint32		offset = 0;
	uint32		i;
	CanonMember *m;

	if (st->nmembers + (int) n > st->maxmembers)
	{
		st->maxmembers = Max(st->maxmembers * 2, st->nmembers + (int) n);
		st->members = repalloc_huge(st->members,
									sizeof(CanonMember) * st->maxmembers);
	}
	m = st->members + first;

	/* keys are children 0..n-1, values n..2n-1; offsets run across both */
	for (i = 0; i < n * 2; i++)
	{
		JEntry		entry = c->children[i];
		uint32		end = JBE_OFFLENFLD(entry);

		if (!JBE_HAS_OFF(entry))
			end += offset;
		if (i < n)
		{
			m[i].key = base + offset;
			m[i].keylen = end - offset;
			m[i].sortkey = m[i].key;
			m[i].sortlen = m[i].keylen;
			if (st->encoding != PG_UTF8 && !CanonIsAscii(m[i].key, m[i].keylen))
			{
				/* converts, or in SQL_ASCII checks that the key is UTF-8 */
				m[i].sortkey = pg_server_to_any(m[i].key, m[i].keylen, PG_UTF8);
				if (m[i].sortkey != m[i].key)
					m[i].sortlen = strlen(m[i].sortkey);
			}
		}
		else
		{
			m[i - n].entry = entry;
			m[i - n].value = CanonChildData(base, entry, offset);
			m[i - n].valuelen = end - offset;
		}
		offset = end;
	}
	st->nmembers += n;
	CanonSortMembers(m, n);

	appendStringInfoCharMacro(&st->out, '{');
	for (i = 0; i < n; i++)
	{
		/* a copy: writing a nested object may move the stack */
		CanonMember member = st->members[first + i];

		CHECK_FOR_INTERRUPTS();
		if (i > 0)
			appendStringInfoCharMacro(&st->out, ',');
		CanonString(&st->out, member.key, member.keylen);
		appendStringInfoCharMacro(&st->out, ':');
		CanonValue(st, member.entry, member.value, member.valuelen);
		CanonMaybeFlush(st);
	}
	appendStringInfoCharMacro(&st->out, '}');

	for (i = 0; i < n; i++)
	{
		m = &st->members[first + i];
		if (m->sortkey != m->key)
			pfree((char *) m->sortkey);
	}
	st->nmembers = first;
}

/* Write an array (or the lone element of a scalar root), order kept */
static void
CanonArray(CanonState *st, const JsonbContainer *c)
{
	uint32		n = JsonContainerSize(c);
	const char *base = (const char *) &c->children[n];
	bool		scalar = JsonContainerIsScalar(c);
	uint32		offset = 0;
	uint32		i;

	if (!scalar)
		appendStringInfoCharMacro(&st->out, '[');
	for (i = 0; i < n; i++)
	{
		JEntry		entry = c->children[i];
		uint32		end = JBE_OFFLENFLD(entry);

		CHECK_FOR_INTERRUPTS();
		if (!JBE_HAS_OFF(entry))
			end += offset;
		if (i > 0)
			appendStringInfoCharMacro(&st->out, ',');
		CanonValue(st, entry, CanonChildData(base, entry, offset), end - offset);
		CanonMaybeFlush(st);
		offset = end;
	}
	if (!scalar)
		appendStringInfoCharMacro(&st->out, ']');
}

/* Write an object or array; nesting depth is bounded by max_stack_depth */
static void
CanonContainer(CanonState *st, const JsonbContainer *c)
{
	check_stack_depth();
	if (JsonContainerIsObject(c))
		CanonObject(st, c);
	else
		CanonArray(st, c);
}

/*
 * Serialize jb into st->out (after `reserve` bytes left for the caller),
 * hashing as it goes when hash is given.
 */
static void
CanonSerialize(CanonState *st, Jsonb *jb, int reserve, CanonSha256 *hash)
{
	/* canonical text is usually no longer than jsonb's binary form */
	int			initial = Min(VARSIZE(jb) + reserve + 64,
							  hash ? CANON_FLUSH_BYTES + 1024 : MaxAllocSize / 2);

	st->out.data = palloc(initial);
	st->out.maxlen = initial;
	st->out.len = reserve;
	st->out.cursor = 0;
	st->out.data[reserve] = '\0';
	st->maxmembers = 32;
	st->nmembers = 0;
	st->members = palloc(sizeof(CanonMember) * st->maxmembers);
	st->encoding = GetDatabaseEncoding();
	st->hash = hash;

	CanonContainer(st, &jb->root);

	pfree(st->members);
	st->members = NULL;
}

/* The RFC 8785 canonical form of a jsonb value, as text in the database encoding */
text *
IdemCanonicalJsonb(Jsonb *jb)
{
	CanonState	st;

	CanonSerialize(&st, jb, VARHDRSZ, NULL);
	/* in SQL_ASCII, refuse what we could not hash either */
	if (st.encoding == PG_SQL_ASCII)
		(void) pg_verify_mbstr(PG_UTF8, st.out.data + VARHDRSZ,
							   st.out.len - VARHDRSZ, false);
	SET_VARSIZE(st.out.data, st.out.len);
	return (text *) st.out.data;
}

/* SHA-256 of the UTF-8 bytes of jb's canonical form, as a palloc'd bytea */
bytea *
IdemHashJsonb(Jsonb *jb)
{
	CanonState	st;
	CanonSha256 hash;
	bytea	   *result = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	CanonSha256Begin(&hash);
	CanonSerialize(&st, jb, 0, &hash);
	CanonFlush(&st);
	CanonSha256End(&hash, (uint8 *) VARDATA(result));
	pfree(st.out.data);
	SET_VARSIZE(result, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	return result;
}

/* idem_canonical(jsonb) returns text */
Datum
idem_canonical(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	text	   *result = IdemCanonicalJsonb(jb);

	PG_FREE_IF_COPY(jb, 0);
	PG_RETURN_TEXT_P(result);
}

/* idem_hash(jsonb) returns bytea */
Datum
idem_hash(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	bytea	   *result = IdemHashJsonb(jb);

	PG_FREE_IF_COPY(jb, 0);
	PG_RETURN_BYTEA_P(result);
}
