-- idempotency 0.2.0 -> 0.3.0: run by ALTER EXTENSION idempotency UPDATE.
--
-- Every catalog change of release 0.3.0 goes here, and the same change goes
-- into idempotency.sql, so that a database updated from 0.2.0 and one
-- created at 0.3.0 hold the same objects (test/t/050_upgrade.pl checks
-- both).  Records and reconcilers stay as they are, with their meaning.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- idem_lookup answers about the reservations this transaction holds, which
-- live in the backend's memory: it never runs in a parallel worker.  (A
-- catalog change only: no lock on idem_keys.)
ALTER FUNCTION @extschema@.idem_lookup(text, text, text) PARALLEL RESTRICTED;
