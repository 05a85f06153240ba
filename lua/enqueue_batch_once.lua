-- enqueue_batch_once: add one chunk of jobs unless the chunk's marker is alive (the Spark
-- data source's idempotent write: a re-run task sends the same chunk under the same marker).
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = chunk marker {chasqui:<q>}:unique:<chunk id>
-- ARGV    = [marker_ttl_ms, max_stream_len, then 3 per job: run_at, payload, name]
--           run_at "0": payload = envelope, XADD (name "" = no `n` field);
--           else payload = delayed member (u32le name length + name + envelope), ZADD at run_at
-- Reply   = number of jobs added, or -1 when the marker was there (nothing written); an error,
--           nothing written, when the stream or the delayed set is of another type
--#include key_types
local refused = wrong_type('enqueue_batch_once', {KEYS[1], 'stream+', KEYS[2], 'zset'})
if refused then
  return refused
end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[1]) then
  return -1
end
local maxlen = ARGV[2]
local n = 0
for i = 3, #ARGV, 3 do
  local name = ARGV[i + 2]
  if ARGV[i] ~= '0' then
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i + 1])
  elseif name == '' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 1])
  else
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 1], 'n', name)
  end
  n = n + 1
end
return n
