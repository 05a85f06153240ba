-- replay_dlq: move DLQ entries back to the stream (wire spec 11.3); concurrent replays
-- cannot duplicate because the XDEL gates the XADD.
-- KEYS[1] = dlq   KEYS[2] = stream
-- ARGV    = [max_stream_len, then 3 per entry: dlq_id, envelope, name]
-- Reply   = number replayed; an error, nothing moved, when either key is of another type (an
--           entry deleted from the DLQ must reach the stream)
--#include key_types
local refused = wrong_type('replay_dlq', {KEYS[1], 'stream', KEYS[2], 'stream+'})
if refused then
  return refused
end
local n = 0
for i = 2, #ARGV, 3 do
  if redis.call('XDEL', KEYS[1], ARGV[i]) == 1 then
    if ARGV[i + 2] == '' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'd', ARGV[i + 1])
    else
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'd', ARGV[i + 1], 'n', ARGV[i + 2])
    end
    n = n + 1
  end
end
return n
