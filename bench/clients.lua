-- wrk script of bench/clients.sh: POST with a bearer token and a JSON body;
-- the Idempotency-Key is unique per request ("new": run-thread-counter) or
-- one of the 16 keys completed beforehand ("replay": replay-0 .. replay-15).
-- Arguments (after --): MODE RUN-ID.

local threads = 0

function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end

function init(args)
	mode = args[1]
	prefix = args[2] .. "-" .. tid .. "-"
	counter = 0
	wrk.method = "POST"
	wrk.body = '{"n": 1}'
	wrk.headers["Content-Type"] = "application/json"
	wrk.headers["Authorization"] = "Bearer token-a"
end

function request()
	counter = counter + 1
	if mode == "replay" then
		wrk.headers["Idempotency-Key"] = "replay-" .. (counter % 16)
	else
		wrk.headers["Idempotency-Key"] = prefix .. counter
	end
	return wrk.format()
end
