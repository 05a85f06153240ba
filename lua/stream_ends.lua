-- stream_ends: the ids of a stream's first and last entries, without their fields, so a tool
-- that only needs where a stream starts and ends (a purge fixing its end, a reader planning
-- partitions) never pulls a payload over the network.
-- KEYS[1] = stream
-- Reply   = [first id, last id], or [] when the stream is empty or missing
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then return {} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
return {first[1][1], last[1][1]}
