/*
 * loadgen: the one load generator behind bench/suites/80_contention.sh,
 * 85_storm.sh, 90_faults.sh and 95_scale.sh.
 *
 * It runs a pgbench-style script (a subset: SQL commands ending in ";" or
 * "\gset", "\set NAME random(LO, HI)", "\if :VAR", "\else", "\endif") from
 * each of -c connections, one thread each, for -T seconds, so that every
 * variant of a table is driven by the same client code.  One meta-command
 * is its own: "\redis [NAME] ARG..." sends a command to redis-server
 * (hiredis) and keeps the reply in NAME (nil as the empty string).
 *
 * Prepared statements are the default, as drivers send them: a quoted
 * literal holding a :variable becomes a text parameter, a bare :variable a
 * parameter of the variable's type (int8 for \set, the column's type for
 * \gset).  -M simple sends the text with the values written in, as
 * pgbench -M simple does.
 *
 * Keys: with --key-var NAME, "\set NAME ..." takes the next key of the
 * request instead of a random number; --key-shape says what keys look like:
 * seq (unique per request, --key-prefix, the connection and a number; in a
 * storm the same for every copy of a request), uuid4 (random), uuid7 (time-ordered, 48 bits of milliseconds
 * first), list (a random one of the rows of --key-list SQL).
 *
 * Modes: each request once (default); --copies N: each request sent N
 * times at once (the retry storm: one queue of attempts, each request's N
 * copies next to each other, taken by whichever connection is free, so the
 * copies go out together on different connections; a notice containing
 * "bench effect" marks the attempt that ran the effect, every other one is
 * a duplicate whose latency is kept); --retry-lags A,B: after each new
 * request a connection re-sends the requests it sent A and B requests ago
 * (retries in flight for the fault run), reconnecting after any error.
 * --answer-sqlstates lists the SQLSTATEs of errors that are answers (an
 * in-progress key raised as an ERROR), not failures.
 *
 * Measures, printed as one line of NAME=VALUE: requests, requests/s,
 * errors, with --server-pid the CPU time (utime + stime from /proc) of that
 * process and its children (live ones, plus the reaped ones its cutime and
 * cstime hold) per request, with --redis-pid the same for redis-server,
 * with --wal the WAL bytes per request, with --sample the mean number of
 * backends waiting on a Lock and active, sampled from pg_stat_activity.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#define INT8OID 20
#define TEXTOID 25
#define MAX_VARS 32
#define MAX_PARAMS 16
#define MAX_ARGS 16

typedef enum
{
	CMD_SQL,
	CMD_SET,
	CMD_IF,
	CMD_ELSE,
	CMD_ENDIF,
	CMD_REDIS
} CmdKind;

typedef struct
{
	CmdKind		kind;
	char	   *text;			/* SQL, or the \redis arguments */
	bool		gset;			/* SQL ending in \gset */
	char	   *var;			/* \set, \if and \redis: the variable */
	int64_t		lo,
				hi;				/* \set random(lo, hi) */
	int			jump;			/* \if: its \else or \endif; \else: \endif */
} Cmd;

typedef struct
{
	char		name[64];
	char	   *value;
	unsigned	type;			/* INT8OID, TEXTOID or a column's type */
} Var;

/* A prepared statement: the text with $n, and how to compute each $n */
typedef struct
{
	char	   *text;
	int			nparams;
	char	   *param_tmpl[MAX_PARAMS]; /* a template with :vars, or NULL */
	char	   *param_var[MAX_PARAMS];	/* a bare variable */
	unsigned	param_type[MAX_PARAMS];
} Prepared;

typedef struct
{
	int			id;
	PGconn	   *conn;
	redisContext *redis;
	Var			vars[MAX_VARS];
	int			nvars;
	Prepared   *prep;			/* one per command, built on first use */
	bool	   *prepared;		/* per command, on this connection */
	uint64_t	rng;
	bool		effect_seen;
	char		sqlstate[6];	/* of the last error, or "" */
	int64_t		requests;		/* requests done (in a storm: attempts answered) */
	int64_t		attempts;
	int64_t		errors;
	int64_t		effects;		/* attempts that ran the effect */
	double	   *dup_lat;		/* ms, duplicates of a storm */
	int64_t		ndup,
				dup_cap;
	char		keybuf[128];
	int64_t		group;			/* the keys' middle part: the connection, 0 in a storm */
	int64_t		seqno;
} Client;

static const char *conninfo = "";
static const char *script_path;
static const char *redis_path;
static const char *key_var;
static const char *key_shape = "seq";
static const char *key_prefix = "r";
static const char *key_list_sql;
static bool simple_protocol;
static int	nclients = 4;
static double duration = 10;
static int	copies = 1;
static int	retry_lags[4];
static int	nretry_lags;
static long server_pid;
static long redis_pid;
static bool want_wal;
static bool want_sample;
static const char *answer_states = "";	/* errors that are answers */

static Cmd *cmds;
static int	ncmds;
static char **key_list;
static int64_t nkey_list;
static volatile bool stop;
static int64_t next_attempt;	/* the storm's queue */
static pthread_barrier_t start_barrier;

static void
die(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	fputs("loadgen: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void *
xmalloc(size_t n)
{
	void	   *p = calloc(1, n ? n : 1);

	if (p == NULL)
		die("out of memory");
	return p;
}

static char *
xstrndup(const char *s, size_t n)
{
	char	   *p = xmalloc(n + 1);

	memcpy(p, s, n);
	return p;
}

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static uint64_t
next_rand(uint64_t *state)
{
	/* xorshift64* */
	uint64_t	x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* ---------- the script ---------- */

static char *
trim(char *s)
{
	char	   *e;

	while (isspace((unsigned char) *s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char) e[-1]))
		*--e = '\0';
	return s;
}

static void
add_cmd(Cmd cmd)
{
	cmds = realloc(cmds, sizeof(Cmd) * (ncmds + 1));
	if (cmds == NULL)
		die("out of memory");
	cmds[ncmds++] = cmd;
}

static void
parse_meta(char *line, int lineno)
{
	Cmd			cmd = {0};
	char		name[64];
	long long	lo,
				hi;

	if (sscanf(line, "\\set %63s random(%lld, %lld)", name, &lo, &hi) == 3)
	{
		cmd.kind = CMD_SET;
		cmd.var = strdup(name);
		cmd.lo = lo;
		cmd.hi = hi;
	}
	else if (sscanf(line, "\\if :%63s", name) == 1)
	{
		cmd.kind = CMD_IF;
		cmd.var = strdup(name);
	}
	else if (strcmp(line, "\\else") == 0)
		cmd.kind = CMD_ELSE;
	else if (strcmp(line, "\\endif") == 0)
		cmd.kind = CMD_ENDIF;
	else if (strncmp(line, "\\redis ", 7) == 0)
	{
		char	   *rest = trim(line + 7);
		char	   *sp = strchr(rest, ' ');

		if (sp == NULL)
			die("%s:%d: \\redis needs a variable (or -) and a command", script_path, lineno);
		cmd.kind = CMD_REDIS;
		cmd.var = xstrndup(rest, sp - rest);
		cmd.text = strdup(trim(sp));
	}
	else
		die("%s:%d: unsupported meta-command: %s", script_path, lineno, line);
	add_cmd(cmd);
}

static void
load_script(const char *path)
{
	FILE	   *f = fopen(path, "r");
	char		line[4096];
	char	   *sql = NULL;
	size_t		sqllen = 0;
	int			lineno = 0;
	int			stack[16];
	int			depth = 0;

	if (f == NULL)
		die("could not open \"%s\": %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
	{
		char	   *t = trim(line);
		size_t		len = strlen(t);
		bool		gset = false;

		lineno++;
		if (sql == NULL && (len == 0 || strncmp(t, "--", 2) == 0))
			continue;
		if (sql == NULL && t[0] == '\\')
		{
			parse_meta(t, lineno);
			continue;
		}
		if (len >= 5 && strcmp(t + len - 5, "\\gset") == 0)
		{
			gset = true;
			t[len - 5] = '\0';
			t = trim(t);
			len = strlen(t);
		}
		sql = realloc(sql, sqllen + len + 2);
		if (sql == NULL)
			die("out of memory");
		if (sqllen > 0)
			sql[sqllen++] = '\n';
		memcpy(sql + sqllen, t, len + 1);
		sqllen += len;
		if (gset || (len > 0 && t[len - 1] == ';'))
		{
			Cmd			cmd = {0};

			if (!gset)
				sql[--sqllen] = '\0';	/* the ";" */
			cmd.kind = CMD_SQL;
			cmd.text = sql;
			cmd.gset = gset;
			add_cmd(cmd);
			sql = NULL;
			sqllen = 0;
		}
	}
	fclose(f);
	if (sql != NULL)
		die("%s: the last SQL command has no \";\"", path);

	/* \if ... \else ... \endif jumps */
	for (int i = 0; i < ncmds; i++)
	{
		if (cmds[i].kind == CMD_IF)
		{
			if (depth == 16)
				die("%s: \\if nested too deep", path);
			stack[depth++] = i;
		}
		else if (cmds[i].kind == CMD_ELSE)
		{
			if (depth == 0)
				die("%s: \\else without \\if", path);
			cmds[stack[depth - 1]].jump = i;
			stack[depth - 1] = i;
		}
		else if (cmds[i].kind == CMD_ENDIF)
		{
			if (depth == 0)
				die("%s: \\endif without \\if", path);
			cmds[stack[--depth]].jump = i;
		}
	}
	if (depth != 0)
		die("%s: \\if without \\endif", path);
}

/* ---------- variables ---------- */

static Var *
find_var(Client *c, const char *name, size_t len)
{
	for (int i = 0; i < c->nvars; i++)
		if (strlen(c->vars[i].name) == len && strncmp(c->vars[i].name, name, len) == 0)
			return &c->vars[i];
	return NULL;
}

static void
set_var(Client *c, const char *name, const char *value, unsigned type)
{
	Var		   *v = find_var(c, name, strlen(name));

	if (v == NULL)
	{
		if (c->nvars == MAX_VARS)
			die("too many variables");
		v = &c->vars[c->nvars++];
		snprintf(v->name, sizeof(v->name), "%s", name);
	}
	free(v->value);
	v->value = strdup(value);
	v->type = type;
}

static bool
var_true(Client *c, const char *name)
{
	Var		   *v = find_var(c, name, strlen(name));
	const char *s;

	if (v == NULL)
		die("variable \"%s\" is not set", name);
	s = v->value;
	return !(s[0] == '\0' || strcmp(s, "0") == 0 || strcmp(s, "f") == 0 ||
			 strcmp(s, "false") == 0 || strcmp(s, "off") == 0);
}

static size_t
ident_len(const char *s)
{
	size_t		n = 0;

	while (isalnum((unsigned char) s[n]) || s[n] == '_')
		n++;
	return n;
}

/* Append to a growing buffer */
typedef struct
{
	char	   *data;
	size_t		len,
				cap;
} Buf;

static void
buf_add(Buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap)
	{
		b->cap = (b->len + n + 1) * 2;
		b->data = realloc(b->data, b->cap);
		if (b->data == NULL)
			die("out of memory");
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = '\0';
}

/* Write s into b with every :variable that is set replaced by its value */
static void
substitute(Client *c, Buf *b, const char *s, size_t n)
{
	size_t		i = 0;

	while (i < n)
	{
		if (s[i] == ':' && i + 1 < n && s[i + 1] == ':')
		{
			buf_add(b, s + i, 2);
			i += 2;
			continue;
		}
		if (s[i] == ':')
		{
			size_t		len = ident_len(s + i + 1);
			Var		   *v = len ? find_var(c, s + i + 1, len) : NULL;

			if (v != NULL)
			{
				buf_add(b, v->value, strlen(v->value));
				i += 1 + len;
				continue;
			}
		}
		buf_add(b, s + i, 1);
		i++;
	}
}

/* Does s[0..n) hold a :variable that is set? */
static bool
has_var(Client *c, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
	{
		if (s[i] == ':' && i + 1 < n && s[i + 1] == ':')
			i++;
		else if (s[i] == ':' && find_var(c, s + i + 1, ident_len(s + i + 1)) != NULL &&
				 ident_len(s + i + 1) > 0)
			return true;
	}
	return false;
}

/*
 * Turn a command's SQL into a statement with parameters: a quoted literal
 * with a :variable in it becomes a text parameter ('k-:k' -> $1), a bare
 * :variable a parameter of its variable's type.
 */
static void
build_prepared(Client *c, const char *sql, Prepared *p)
{
	Buf			out = {0};
	size_t		i = 0,
				n = strlen(sql);

	while (i < n)
	{
		if (sql[i] == '\'')
		{
			size_t		j = i + 1;

			while (j < n && !(sql[j] == '\'' && !(j + 1 < n && sql[j + 1] == '\'')))
				j += (sql[j] == '\'') ? 2 : 1;
			if (j >= n)
				die("unterminated quoted string in: %s", sql);
			if (has_var(c, sql + i + 1, j - i - 1))
			{
				char		num[16];
				Buf			lit = {0};

				if (p->nparams == MAX_PARAMS)
					die("too many parameters in: %s", sql);
				/* the literal's value: '' is one quote */
				for (size_t k = i + 1; k < j; k++)
				{
					buf_add(&lit, sql + k, 1);
					if (sql[k] == '\'')
						k++;
				}
				p->param_tmpl[p->nparams] = lit.data;
				p->param_type[p->nparams] = TEXTOID;
				snprintf(num, sizeof(num), "$%d", ++p->nparams);
				buf_add(&out, num, strlen(num));
			}
			else
				buf_add(&out, sql + i, j - i + 1);
			i = j + 1;
			continue;
		}
		if (sql[i] == ':' && i + 1 < n && sql[i + 1] == ':')
		{
			buf_add(&out, "::", 2);
			i += 2;
			continue;
		}
		if (sql[i] == ':')
		{
			size_t		len = ident_len(sql + i + 1);
			Var		   *v = len ? find_var(c, sql + i + 1, len) : NULL;

			if (v != NULL)
			{
				char		num[16];

				if (p->nparams == MAX_PARAMS)
					die("too many parameters in: %s", sql);
				p->param_var[p->nparams] = strdup(v->name);
				p->param_type[p->nparams] = v->type;
				snprintf(num, sizeof(num), "$%d", ++p->nparams);
				buf_add(&out, num, strlen(num));
				i += 1 + len;
				continue;
			}
		}
		buf_add(&out, sql + i, 1);
		i++;
	}
	p->text = out.data;
}

/* ---------- connections ---------- */

static void
notice_receiver(void *arg, const PGresult *res)
{
	Client	   *c = arg;
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	if (msg != NULL && strstr(msg, "bench effect") != NULL)
		c->effect_seen = true;
}

static void
quiet_notice(void *arg, const PGresult *res)
{
	(void) arg;
	(void) res;
}

static PGconn *
pg_connect(bool must)
{
	PGconn	   *conn = PQconnectdb(conninfo);

	if (PQstatus(conn) != CONNECTION_OK)
	{
		if (must)
			die("could not connect: %s", PQerrorMessage(conn));
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

static redisContext *
redis_connect(bool must)
{
	redisContext *r = redisConnectUnix(redis_path);

	if (r == NULL || r->err)
	{
		if (must)
			die("could not connect to redis at \"%s\": %s", redis_path,
				r ? r->errstr : "out of memory");
		if (r)
			redisFree(r);
		return NULL;
	}
	return r;
}

/* Connect (again) until it works or the run is over */
static bool
client_connect(Client *c, bool must)
{
	while (c->conn == NULL)
	{
		c->conn = pg_connect(must);
		if (c->conn == NULL)
		{
			if (stop)
				return false;
			usleep(20000);
			continue;
		}
		PQsetNoticeReceiver(c->conn, notice_receiver, c);
		memset(c->prepared, 0, sizeof(bool) * ncmds);
	}
	while (redis_path != NULL && c->redis == NULL)
	{
		c->redis = redis_connect(must);
		if (c->redis == NULL)
		{
			if (stop)
				return false;
			usleep(20000);
		}
	}
	return true;
}

/* After an error: a lost connection is dropped (and made again later) */
static void
client_error(Client *c)
{
	c->errors++;
	if (c->conn != NULL && PQstatus(c->conn) == CONNECTION_BAD)
	{
		PQfinish(c->conn);
		c->conn = NULL;
	}
	else if (c->conn != NULL && PQtransactionStatus(c->conn) != PQTRANS_IDLE)
	{
		PGresult   *res = PQexec(c->conn, "ROLLBACK");

		PQclear(res);
		if (PQstatus(c->conn) == CONNECTION_BAD)
		{
			PQfinish(c->conn);
			c->conn = NULL;
		}
	}
	if (c->redis != NULL && c->redis->err)
	{
		redisFree(c->redis);
		c->redis = NULL;
	}
}

/* ---------- one request ---------- */

static void
format_uuid(char *out, size_t outlen, uint64_t hi, uint64_t lo)
{
	snprintf(out, outlen, "%08" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%012" PRIx64,
			 hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff, lo >> 48, lo & (uint64_t) 0xffffffffffff);
}

/* The key of request number n */
static const char *
make_key(Client *c, int64_t n)
{
	if (strcmp(key_shape, "seq") == 0)
		snprintf(c->keybuf, sizeof(c->keybuf), "%s-%" PRId64 "-%" PRId64, key_prefix, c->group, n);
	else if (strcmp(key_shape, "uuid4") == 0)
	{
		uint64_t	hi = next_rand(&c->rng),
					lo = next_rand(&c->rng);

		hi = (hi & ~0xf000ULL) | 0x4000ULL;
		lo = (lo & ~(3ULL << 62)) | (2ULL << 62);
		format_uuid(c->keybuf, sizeof(c->keybuf), hi, lo);
	}
	else if (strcmp(key_shape, "uuid7") == 0)
	{
		struct timespec ts;
		uint64_t	ms,
					hi,
					lo = next_rand(&c->rng);

		clock_gettime(CLOCK_REALTIME, &ts);
		ms = (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		hi = (ms << 16) | 0x7000ULL | (next_rand(&c->rng) & 0xfff);
		lo = (lo & ~(3ULL << 62)) | (2ULL << 62);
		format_uuid(c->keybuf, sizeof(c->keybuf), hi, lo);
	}
	else if (strcmp(key_shape, "list") == 0)
		snprintf(c->keybuf, sizeof(c->keybuf), "%s",
				 key_list[next_rand(&c->rng) % (uint64_t) nkey_list]);
	else
		die("unknown key shape \"%s\"", key_shape);
	return c->keybuf;
}

static bool
run_sql(Client *c, int i)
{
	Cmd		   *cmd = &cmds[i];
	PGresult   *res;
	ExecStatusType st;

	if (simple_protocol)
	{
		Buf			b = {0};

		substitute(c, &b, cmd->text, strlen(cmd->text));
		res = PQexec(c->conn, b.data);
		free(b.data);
	}
	else
	{
		Prepared   *p = &c->prep[i];
		const char *values[MAX_PARAMS];
		Buf			vals[MAX_PARAMS] = {{0}};
		char		name[16];

		snprintf(name, sizeof(name), "s%d", i);
		if (p->text == NULL)
			build_prepared(c, cmd->text, p);
		if (!c->prepared[i])
		{
			res = PQprepare(c->conn, name, p->text, p->nparams, p->param_type);
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
			{
				const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

				/* a mistake in the script, not a fault of the run */
				if (state != NULL && strncmp(state, "42", 2) == 0)
					die("could not prepare \"%s\": %s", p->text, PQerrorMessage(c->conn));
				snprintf(c->sqlstate, sizeof(c->sqlstate), "%s", state ? state : "");
				PQclear(res);
				return false;
			}
			PQclear(res);
			c->prepared[i] = true;
		}
		for (int k = 0; k < p->nparams; k++)
		{
			if (p->param_tmpl[k] != NULL)
			{
				substitute(c, &vals[k], p->param_tmpl[k], strlen(p->param_tmpl[k]));
				values[k] = vals[k].data ? vals[k].data : "";
			}
			else
				values[k] = find_var(c, p->param_var[k], strlen(p->param_var[k]))->value;
		}
		res = PQexecPrepared(c->conn, name, p->nparams, values, NULL, NULL, 0);
		for (int k = 0; k < p->nparams; k++)
			free(vals[k].data);
	}
	st = PQresultStatus(res);
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
	{
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		snprintf(c->sqlstate, sizeof(c->sqlstate), "%s", state ? state : "");
		PQclear(res);
		return false;
	}
	if (cmd->gset)
	{
		if (PQntuples(res) != 1)
			die("\\gset needs one row, got %d: %s", PQntuples(res), cmd->text);
		for (int f = 0; f < PQnfields(res); f++)
			set_var(c, PQfname(res, f), PQgetvalue(res, 0, f), PQftype(res, f));
	}
	PQclear(res);
	return true;
}

static bool
run_redis(Client *c, Cmd *cmd)
{
	Buf			b = {0};
	const char *argv[MAX_ARGS];
	int			argc = 0;
	char	   *save,
			   *tok;
	redisReply *r;
	bool		ok = true;

	substitute(c, &b, cmd->text, strlen(cmd->text));
	for (tok = strtok_r(b.data, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
	{
		if (argc == MAX_ARGS)
			die("too many redis arguments: %s", cmd->text);
		argv[argc++] = tok;
	}
	r = redisCommandArgv(c->redis, argc, argv, NULL);
	if (r == NULL || r->type == REDIS_REPLY_ERROR)
		ok = false;
	else if (strcmp(cmd->var, "-") != 0)
	{
		char		num[32];
		const char *v = "";

		if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
			v = r->str;
		else if (r->type == REDIS_REPLY_INTEGER)
		{
			snprintf(num, sizeof(num), "%lld", r->integer);
			v = num;
		}
		set_var(c, cmd->var, v, TEXTOID);
	}
	if (r)
		freeReplyObject(r);
	free(b.data);
	return ok;
}

/* Run the script once for request n; false after an error */
static bool
run_request(Client *c, int64_t n)
{
	const char *key = NULL;

	if (key_var != NULL)
		key = make_key(c, n);
	c->effect_seen = false;
	for (int i = 0; i < ncmds; i++)
	{
		Cmd		   *cmd = &cmds[i];

		switch (cmd->kind)
		{
			case CMD_SQL:
				if (!run_sql(c, i))
					return false;
				break;
			case CMD_SET:
				if (key != NULL && strcmp(cmd->var, key_var) == 0)
					set_var(c, cmd->var, key, TEXTOID);
				else
				{
					char		num[32];
					uint64_t	span = (uint64_t) (cmd->hi - cmd->lo) + 1;

					snprintf(num, sizeof(num), "%" PRId64,
							 cmd->lo + (int64_t) (next_rand(&c->rng) % span));
					set_var(c, cmd->var, num, INT8OID);
				}
				break;
			case CMD_IF:
				if (!var_true(c, cmd->var))
					i = cmd->jump;	/* its \else or \endif: go on after it */
				break;
			case CMD_ELSE:
				i = cmd->jump;
				break;
			case CMD_ENDIF:
				break;
			case CMD_REDIS:
				if (!run_redis(c, cmd))
					return false;
				break;
		}
	}
	return true;
}

static void
keep_dup(Client *c, double ms)
{
	if (c->ndup == c->dup_cap)
	{
		c->dup_cap = c->dup_cap ? c->dup_cap * 2 : 4096;
		c->dup_lat = realloc(c->dup_lat, sizeof(double) * c->dup_cap);
		if (c->dup_lat == NULL)
			die("out of memory");
	}
	c->dup_lat[c->ndup++] = ms;
}

static bool
attempt(Client *c, int64_t n)
{
	bool		ok;

	if (!client_connect(c, false))
		return false;
	c->attempts++;
	c->sqlstate[0] = '\0';
	ok = run_request(c, n);
	if (!ok)
	{
		/* an in-progress answer raised as an ERROR is an answer all the same */
		bool		answer = c->sqlstate[0] != '\0' && strstr(answer_states, c->sqlstate) != NULL;

		client_error(c);
		if (answer)
		{
			c->errors--;
			ok = true;
		}
	}
	return ok;
}

static void *
client_main(void *arg)
{
	Client	   *c = arg;
	int64_t		n = 0;

	pthread_barrier_wait(&start_barrier);
	if (copies > 1)
	{
		/*
		 * The storm: one queue of attempts, each request's copies next to
		 * each other, taken by whichever connection is free, so that the
		 * copies of a request go out at once on different connections.
		 */
		for (;;)
		{
			int64_t		a = __atomic_fetch_add(&next_attempt, 1, __ATOMIC_RELAXED);
			double		t0;

			if (stop)
				break;
			t0 = now_ms();
			if (attempt(c, a / copies))
			{
				if (c->effect_seen)
					c->effects++;
				else
					keep_dup(c, now_ms() - t0);
			}
			c->requests++;		/* attempts answered; divided by copies */
		}
	}
	else if (nretry_lags > 0)
	{
		/* retries in flight: each new request, then those of A and B ago */
		while (!stop)
		{
			if (attempt(c, n) && c->effect_seen)
				c->effects++;
			for (int k = 0; k < nretry_lags && !stop; k++)
				if (n - retry_lags[k] >= 0 && attempt(c, n - retry_lags[k]) && c->effect_seen)
					c->effects++;
			n++;
			c->requests = n;
		}
	}
	else
	{
		while (!stop)
		{
			if (attempt(c, n))
				c->requests++;
			n++;
		}
	}
	return NULL;
}

/* ---------- measuring ---------- */

/* utime + stime (and, with children, cutime + cstime) of pid, in ticks */
static long long
proc_ticks(long pid, bool children, long *ppid)
{
	char		path[64],
				buf[1024];
	FILE	   *f;
	char	   *p;
	long long	v[17] = {0};

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	if (fgets(buf, sizeof(buf), f) == NULL)
	{
		fclose(f);
		return -1;
	}
	fclose(f);
	p = strrchr(buf, ')');
	if (p == NULL)
		return -1;
	p += 2;
	/* fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt
	 * majflt cmajflt utime stime cutime cstime */
	for (int i = 0; i < 17 && *p; i++)
	{
		while (*p == ' ')
			p++;
		v[i] = (i == 0) ? 0 : strtoll(p, NULL, 10);
		while (*p && *p != ' ')
			p++;
	}
	if (ppid)
		*ppid = (long) v[1];
	return v[11] + v[12] + (children ? v[13] + v[14] : 0);
}

/* CPU ticks of a process, its reaped children and its live children */
static long long
tree_ticks(long pid)
{
	long long	total = proc_ticks(pid, true, NULL);
	DIR		   *d;
	struct dirent *e;

	if (total < 0)
		return 0;
	d = opendir("/proc");
	if (d == NULL)
		return total;
	while ((e = readdir(d)) != NULL)
	{
		long		child = strtol(e->d_name, NULL, 10),
					ppid = 0;
		long long	t;

		if (child <= 0)
			continue;
		t = proc_ticks(child, false, &ppid);
		if (t >= 0 && ppid == pid)
			total += t;
	}
	closedir(d);
	return total;
}

static char *
query_value(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);
	char	   *v;

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		die("query failed: %s: %s", sql, PQerrorMessage(conn));
	v = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return (x > y) - (x < y);
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: loadgen -f SCRIPT [-d CONNINFO] [-c CLIENTS] [-T SECONDS] [-M prepared|simple]\n"
			"       [--redis SOCKET] [--key-var NAME] [--key-shape seq|uuid4|uuid7|list]\n"
			"       [--key-prefix P] [--key-list SQL] [--copies N] [--retry-lags A,B]\n"
			"       [--answer-sqlstates S1,S2] [--server-pid PID] [--redis-pid PID] [--wal] [--sample]\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	Client	   *clients;
	pthread_t  *threads;
	PGconn	   *mon;
	char	   *wal0 = NULL;
	long long	cpu0 = 0,
				rcpu0 = 0,
				cpu1,
				rcpu1;
	double		t0,
				t1,
				lock_sum = 0,
				active_sum = 0;
	int64_t		samples = 0,
				requests = 0,
				attempts = 0,
				errors = 0,
				effects = 0,
				ndup = 0;
	double	   *dups;
	long		tck = sysconf(_SC_CLK_TCK);

	/* a write to a redis-server that was killed must fail, not kill us */
	signal(SIGPIPE, SIG_IGN);

	for (int i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;

#define OPT(name) (strcmp(a, name) == 0 && v != NULL && ++i)
		if (OPT("-f"))
			script_path = v;
		else if (OPT("-d"))
			conninfo = v;
		else if (OPT("-c"))
			nclients = atoi(v);
		else if (OPT("-T"))
			duration = atof(v);
		else if (OPT("-M"))
			simple_protocol = strcmp(v, "simple") == 0;
		else if (OPT("--redis"))
			redis_path = v;
		else if (OPT("--key-var"))
			key_var = v;
		else if (OPT("--key-shape"))
			key_shape = v;
		else if (OPT("--key-prefix"))
			key_prefix = v;
		else if (OPT("--key-list"))
			key_list_sql = v;
		else if (OPT("--copies"))
			copies = atoi(v);
		else if (OPT("--retry-lags"))
		{
			char	   *s = strdup(v),
					   *save,
					   *tok;

			for (tok = strtok_r(s, ",", &save); tok && nretry_lags < 4; tok = strtok_r(NULL, ",", &save))
				retry_lags[nretry_lags++] = atoi(tok);
		}
		else if (OPT("--answer-sqlstates"))
			answer_states = v;
		else if (OPT("--server-pid"))
			server_pid = atol(v);
		else if (OPT("--redis-pid"))
			redis_pid = atol(v);
		else if (strcmp(a, "--wal") == 0)
			want_wal = true;
		else if (strcmp(a, "--sample") == 0)
			want_sample = true;
		else
			usage();
#undef OPT
	}
	if (script_path == NULL || nclients < 1 || copies < 1)
		usage();
	load_script(script_path);

	mon = pg_connect(true);
	/* a crash's "terminating connection" warning is expected in a fault run */
	PQsetNoticeReceiver(mon, quiet_notice, NULL);
	if (key_list_sql != NULL)
	{
		PGresult   *res = PQexec(mon, key_list_sql);

		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) == 0)
			die("--key-list query returned no rows: %s", PQerrorMessage(mon));
		nkey_list = PQntuples(res);
		key_list = xmalloc(sizeof(char *) * nkey_list);
		for (int64_t r = 0; r < nkey_list; r++)
			key_list[r] = strdup(PQgetvalue(res, (int) r, 0));
		PQclear(res);
	}

	clients = xmalloc(sizeof(Client) * nclients);
	threads = xmalloc(sizeof(pthread_t) * nclients);
	pthread_barrier_init(&start_barrier, NULL, nclients + 1);
	for (int i = 0; i < nclients; i++)
	{
		Client	   *c = &clients[i];

		c->id = i;
		c->group = (copies > 1) ? 0 : i;
		c->rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t) time(NULL) << 20) ^ ((uint64_t) getpid() << 8) ^ (uint64_t) (i + 1);
		c->prep = xmalloc(sizeof(Prepared) * ncmds);
		c->prepared = xmalloc(sizeof(bool) * ncmds);
		snprintf(c->keybuf, sizeof(c->keybuf), "%d", i);
		set_var(c, "client_id", c->keybuf, INT8OID);
		client_connect(c, true);
		if (pthread_create(&threads[i], NULL, client_main, c) != 0)
			die("could not start a thread");
	}

	if (want_wal)
		wal0 = query_value(mon, "SELECT pg_current_wal_lsn()");
	if (server_pid)
		cpu0 = tree_ticks(server_pid);
	if (redis_pid)
		rcpu0 = tree_ticks(redis_pid);
	t0 = now_ms();
	pthread_barrier_wait(&start_barrier);
	while ((now_ms() - t0) < duration * 1000)
	{
		if (want_sample)
		{
			PGresult   *res = PQexec(mon,
									 "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
									 " count(*) FILTER (WHERE state = 'active')"
									 " FROM pg_catalog.pg_stat_activity"
									 " WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()");

			if (PQresultStatus(res) == PGRES_TUPLES_OK)
			{
				lock_sum += atof(PQgetvalue(res, 0, 0));
				active_sum += atof(PQgetvalue(res, 0, 1));
				samples++;
			}
			PQclear(res);
			usleep(20000);
		}
		else
			usleep(50000);
	}
	stop = true;
	for (int i = 0; i < nclients; i++)
		pthread_join(threads[i], NULL);
	t1 = now_ms();
	cpu1 = server_pid ? tree_ticks(server_pid) : 0;
	rcpu1 = redis_pid ? tree_ticks(redis_pid) : 0;

	for (int i = 0; i < nclients; i++)
	{
		requests += clients[i].requests;
		attempts += clients[i].attempts;
		errors += clients[i].errors;
		effects += clients[i].effects;
		ndup += clients[i].ndup;
	}
	if (copies > 1)
		requests /= copies;
	printf("requests=%" PRId64 " seconds=%.2f rps=%.1f attempts=%" PRId64 " errors=%" PRId64,
		   requests, (t1 - t0) / 1000, requests / ((t1 - t0) / 1000), attempts, errors);
	if (copies > 1 || nretry_lags > 0)
		printf(" effects_seen=%" PRId64, effects);
	if (server_pid && requests > 0)
		printf(" server_cpu_us=%.1f", (cpu1 - cpu0) * 1e6 / tck / requests);
	if (redis_pid && requests > 0)
		printf(" redis_cpu_us=%.1f", (rcpu1 - rcpu0) * 1e6 / tck / requests);
	if (want_wal && requests > 0)
	{
		char		sql[256];
		char	   *d;

		snprintf(sql, sizeof(sql), "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '%s')", wal0);
		d = query_value(mon, sql);
		printf(" wal_bytes=%.0f", atof(d) / requests);
	}
	if (want_sample && samples > 0)
		printf(" lock_waiting=%.2f active=%.2f", lock_sum / samples, active_sum / samples);
	if (copies > 1)
	{
		int64_t		k = 0;

		dups = xmalloc(sizeof(double) * (ndup + 1));
		for (int i = 0; i < nclients; i++)
			for (int64_t j = 0; j < clients[i].ndup; j++)
				dups[k++] = clients[i].dup_lat[j];
		qsort(dups, ndup, sizeof(double), cmp_double);
		printf(" duplicates=%" PRId64, ndup);
		if (ndup > 0)
			printf(" dup_p50_ms=%.3f dup_p99_ms=%.3f", dups[ndup / 2], dups[(ndup * 99) / 100]);
	}
	printf("\n");
	PQfinish(mon);
	return 0;
}
