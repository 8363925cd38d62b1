-- Nothing is granted to PUBLIC.  CREATE FUNCTION grants EXECUTE to PUBLIC by
-- default; take that back for every function (and procedure: ON ROUTINE)
-- this script created.  Grant recipes for application and monitoring roles
-- are in the README.
DO $$
DECLARE
	f regprocedure;
BEGIN
	FOR f IN
		SELECT p.oid::regprocedure
		FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_depend d
		  ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
		 AND d.objid = p.oid
		 AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
		 AND d.deptype = 'e'
		JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
		WHERE e.extname = 'idempotency'
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f);
	END LOOP;
END
$$;
