-- renew_lease: the worker's lease on its in-flight entries, renewed once per tick for all of them.
-- Each entry this consumer still owns is re-claimed by it with XCLAIM ... 0 ... JUSTID, which
-- resets the entry's idle time without bumping its delivery count, so recovery (XPENDING IDLE
-- + XCLAIM min-idle, in every worker) never takes a job whose worker is alive and renewing.
-- Ownership is checked first, in the same script: a plain XCLAIM with min-idle 0 would steal
-- an entry back from the consumer that took it over while this one was paused or cut off.
-- KEYS[1] = stream
-- ARGV    = [group, consumer, entry_id...]
-- Reply   = flat [entry_id, owner, ...] for each entry this consumer no longer owns
--           (owner = the consumer that holds it now, or '' when it is no longer pending)
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local claim, lost = {'XCLAIM', stream, group, me, 0}, {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)[1]
  if p and p[2] == me then
    claim[#claim + 1] = ARGV[i]
  else
    lost[#lost + 1] = ARGV[i]
    lost[#lost + 1] = p and p[2] or ''
  end
end
if #claim > 5 then
  claim[#claim + 1] = 'JUSTID'
  redis.call(unpack(claim))
end
return lost
