-- enqueue_batch_unique: add_unique for a chunk of jobs with caller ids, one call: each job is
-- added unless its marker (the same {chasqui:<q>}:unique:<id> key add_unique uses) is alive.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[2 + i] = marker of job i
-- ARGV    = [marker_ttl_ms, max_stream_len, then 4 per job: job_id, run_at, payload, name]
--           run_at "0": payload = envelope, XADD; else payload = delayed member, ZADD at run_at
-- Reply   = number of jobs added (the others were suppressed by a live marker); an error, nothing
--           written, when the stream or delayed set is of another type
--#include key_types
local refused = wrong_type('enqueue_batch_unique', {KEYS[1], 'stream+', KEYS[2], 'zset'})
if refused then
  return refused
end
local maxlen = ARGV[2]
local n = 0
local k = 3
for i = 3, #ARGV, 4 do
  if redis.call('SET', KEYS[k], ARGV[i], 'NX', 'PX', ARGV[1]) then
    local name = ARGV[i + 3]
    if ARGV[i + 1] ~= '0' then
      redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i + 2])
    elseif name == '' then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 2])
    else
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 2], 'n', name)
    end
    n = n + 1
  end
  k = k + 1
end
return n
