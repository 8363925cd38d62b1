# PGXS build of the idempotency extension.
#
# The version lives in idempotency.control.  idempotency.sql is the one
# install source: make copies it to idempotency--$(EXTVERSION).sql.  The
# install scripts of earlier releases (kept as released) and the upgrade
# scripts idempotency--A--B.sql are ordinary tracked files.
#
# pg_regress tests are sql/NAME.sql with expected/NAME.out; isolation specs
# are specs/NAME.spec with expected/NAME.out.  Every list is written out
# here, so that nothing depends on the build directory (VPATH builds) or on
# a running server.  The tests that need the library preloaded
# (shared_preload_libraries) ask the server themselves and skip with a line
# "skipped: ..." against a stock one (their expected/NAME_1.out), so that
# `make installcheck` passes on a stock and on a preloading server alike.

EXTENSION = idempotency
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" \
	$(dir $(firstword $(MAKEFILE_LIST)))$(EXTENSION).control)

MODULE_big = $(EXTENSION)
OBJS = \
	src/backoff.o \
	src/batches.o \
	src/canonical.o \
	src/catalog.o \
	src/citus.o \
	src/handlers.o \
	src/held.o \
	src/idempotency.o \
	src/keys.o \
	src/layout.o \
	src/maintenance.o \
	src/patterns.o \
	src/reconcile.o \
	src/records.o \
	src/stats.o \
	src/status.o \
	src/worker.o

DATA_built = $(EXTENSION)--$(EXTVERSION).sql
DATA = \
	$(EXTENSION)--0.1.0.sql \
	$(EXTENSION)--0.1.0--0.2.0.sql \
	$(EXTENSION)--0.2.0.sql \
	$(EXTENSION)--0.2.0--0.3.0.sql

REGRESS = \
	bad_input \
	canonical \
	clock_times \
	distribute \
	handler_builtin \
	held \
	key_lock \
	keys \
	maintenance \
	old_catalog \
	patterns \
	reconcilers \
	reconcilers_update \
	security \
	stats \
	table_rules \
	write_once
REGRESS_OPTS = --load-extension=$(EXTENSION)

ISOLATION = \
	call_in_progress \
	consume_nowait \
	consume_wait \
	drop_extension_race \
	finish_after_vacuum \
	held_ddl_waits \
	held_reservation \
	lookup_own_record \
	maintenance_nowait \
	maintenance_races \
	repeatable_read_writes \
	reserve_concurrent \
	reserve_nowait
ISOLATION_OPTS = --load-extension=$(EXTENSION)

# The TAP tests (test/t/*.pl) start servers of their own, so TAP_TESTS is not
# set: it would add them to installcheck, which Debian runs as root (where
# initdb refuses to run) and before the package is installed.  The whole
# suite, TAP included, is `bash test/run.sh`.
PROVE_TESTS = test/t/*.pl

EXTRA_CLEAN = $(DIST).zip

PG_CONFIG ?= pg_config
# The library knows its own version, to tell an older catalog from an altered one
PG_CPPFLAGS += -DIDEM_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers

# Set WERROR=1 (the test command does) to make every warning fatal.
ifeq ($(WERROR),1)
PG_CFLAGS += -Werror
endif

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# canonical.c hashes with OpenSSL's SHA-256 directly where the server is
# built with OpenSSL (USE_OPENSSL), as Debian's is
ifeq ($(with_ssl),openssl)
SHLIB_LINK += -lcrypto
endif

$(EXTENSION)--$(EXTVERSION).sql: $(EXTENSION).sql
	cp $< $@

# A VPATH build compiles into src/ of the build directory
ifdef VPATH
$(shell mkdir -p src)
endif

prove_installcheck:
	$(prove_installcheck)

# The preloaded pass, on a server of its own, as pg_cron's Makefile runs its
# tests: pg_regress and pg_isolation_regress each start a temporary instance
# of the installed server (initdb and a postmaster in tmp_check/, on a port
# and socket of their own) with test/preload.conf, which preloads the
# library and leaves the worker running, so no test skips itself there.
# As installcheck, it needs the extension installed; initdb refuses to run
# as root.  REGRESS= or ISOLATION= runs one kind, as for installcheck.
PRELOAD_OPTS = --temp-instance=./tmp_check --temp-config=$(srcdir)/test/preload.conf
installcheck-preloaded: submake $(REGRESS_PREP)
ifdef REGRESS
	$(pg_regress_installcheck) $(REGRESS_OPTS) $(PRELOAD_OPTS) $(REGRESS)
endif
ifdef ISOLATION
	$(pg_isolation_regress_installcheck) $(ISOLATION_OPTS) $(PRELOAD_OPTS) $(ISOLATION)
endif

# The PGXN distribution: NAME-VERSION.zip of the committed tree, under a
# top directory NAME-VERSION/ (make builds the install script from it)
DIST = $(EXTENSION)-$(EXTVERSION)
dist:
	git archive --format=zip --prefix=$(DIST)/ --output=$(DIST).zip HEAD

.PHONY: prove_installcheck installcheck-preloaded dist
