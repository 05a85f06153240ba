-- release_lock: compare-and-delete a leader lock on clean shutdown (wire spec 11.4).
-- KEYS[1] = lock   ARGV = [holder_id]   Reply = 1 released, 0 not ours (a key of another type: not ours)
if redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
