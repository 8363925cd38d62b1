-- idempotency 0.1.0 -> 0.2.0: run by ALTER EXTENSION idempotency UPDATE.
--
-- Every catalog change of release 0.2.0 goes here, and the same change goes
-- into sql/install/*.sql, so that a database updated from 0.1.0 and one
-- created at 0.2.0 hold the same objects (test/t checks both).  Records and
-- reconcilers stay as they are, with their meaning.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit
