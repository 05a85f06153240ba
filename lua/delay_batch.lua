-- delay_batch: ZADD many delayed members in one round trip (bulk delayed adds).
-- KEYS[1] = {chasqui:<q>}:delayed
-- ARGV    = [2 per job: run_at_ms, member]
-- Reply   = number of members added
local n = 0
for i = 1, #ARGV, 2 do
  n = n + redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
end
return n
