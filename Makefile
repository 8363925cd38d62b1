# PGXS build of the idempotency extension.
#
# The version lives in idempotency.control; the install script of that
# version is assembled from sql/install/*.sql (one file per responsibility,
# applied in name order) and is the only file make generates in sql/.  The
# install scripts of earlier releases (kept as released) and the upgrade
# scripts sql/idempotency--A--B.sql are ordinary tracked files.
# pg_regress tests are test/sql/*.sql with test/expected/*.out, isolation
# specs are test/specs/*.spec with test/expected/*.out; both are globbed, so
# adding a test is adding its files.

EXTENSION = idempotency
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big = $(EXTENSION)
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard sql/$(EXTENSION)--*.sql))
INSTALL_SQL = $(sort $(wildcard sql/install/*.sql))

REGRESS_ALL = $(sort $(patsubst test/sql/%.sql,%,$(wildcard test/sql/*.sql)))
REGRESS_OPTS = --load-extension=$(EXTENSION) --inputdir=test

# The tests that read the statistics need a server that preloads the library
# (shared_preload_libraries).  installcheck runs them only against such a
# server and names them as skipped against any other, so that it passes
# against a stock server as packagers run it.  PRELOADED=yes|no says what the
# server does instead of asking it (test/run.sh says yes on its preloaded
# cluster, so that a lost setting fails rather than skips).
REGRESS_PRELOADED = maintenance patterns stats
PRELOADED ?= $(if $(filter idempotency,$(subst $(comma), ,$(subst ",,$(shell \
	'$(bindir)/psql' -XAtq -d postgres -c 'SHOW shared_preload_libraries' 2>/dev/null)))),yes,no)
REGRESS = $(filter-out $(if $(filter yes,$(PRELOADED)),,$(REGRESS_PRELOADED)),$(REGRESS_ALL))
comma := ,

ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --load-extension=$(EXTENSION) --inputdir=test

EXTRA_CLEAN = results output_iso regression.* tmp_check test/results $(DIST).zip

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

sql/$(EXTENSION)--$(EXTVERSION).sql: $(INSTALL_SQL) $(EXTENSION).control
	{ echo '-- idempotency $(EXTVERSION): generated from sql/install/*.sql by make; do not edit'; \
	  printf '%s\n' '\echo Use "CREATE EXTENSION $(EXTENSION)" to load this file. \quit'; \
	  for f in $(INSTALL_SQL); do echo; echo "-- $$f"; cat $$f; done; } > $@

# The TAP tests (test/t/*.pl) start servers of their own, so TAP_TESTS is not
# set: it would add them to installcheck, which Debian runs as root (where
# initdb refuses to run) and before the package is installed.
PROVE_TESTS = test/t/*.pl

# installcheck runs both of these; test/run.sh runs them one by one
installcheck-regress: preloaded-notice
	$(pg_regress_installcheck) $(REGRESS_OPTS) $(REGRESS)

installcheck-isolation:
	$(pg_isolation_regress_installcheck) $(ISOLATION_OPTS) $(ISOLATION)

installcheck: preloaded-notice

# Name the tests this server cannot run, one line each
preloaded-notice:
	@$(if $(filter yes,$(PRELOADED)),:,$(foreach t,$(filter $(REGRESS_PRELOADED),$(REGRESS_ALL)),\
	  echo "skipped $(t): the server does not preload idempotency (shared_preload_libraries)";))

prove_installcheck:
	$(prove_installcheck)

# The PGXN distribution: NAME-VERSION.zip of the committed tree, under a
# top directory NAME-VERSION/ (make builds the install script from it)
DIST = $(EXTENSION)-$(EXTVERSION)
dist:
	git archive --format=zip --prefix=$(DIST)/ --output=$(DIST).zip HEAD

.PHONY: installcheck-regress installcheck-isolation preloaded-notice prove_installcheck dist
