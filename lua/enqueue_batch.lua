-- enqueue_batch: XADD many jobs in one round trip (the bulk producer path).
-- KEYS[1] = {chasqui:<q>}:stream
-- ARGV    = [max_stream_len, then 2 per job: envelope, name]  (name "" = no `n` field)
-- Reply   = number of entries added
local maxlen = ARGV[1]
local n = 0
for i = 2, #ARGV, 2 do
  local name = ARGV[i + 1]
  if name == '' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i])
  else
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i], 'n', name)
  end
  n = n + 1
end
return n
