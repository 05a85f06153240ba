-- key_types: the keys a script writes, checked before its first write (`--#include key_types`).
-- A script's writes are not rolled back when a later command fails: a marker set first would
-- make the retry write nothing, a job taken from one key and not written to the other would be
-- lost, one written and not taken would be moved again.

-- stream_last_id(key): XINFO STREAM's last-generated-id (it stays when that entry is deleted),
-- or nil when `key` is no stream.
local function stream_last_id(key)
  local info = redis.pcall('XINFO', 'STREAM', key)
  if type(info) ~= 'table' or info.err then
    return nil
  end
  for j = 1, #info - 1, 2 do
    if info[j] == 'last-generated-id' then
      return info[j + 1]
    end
  end
  return nil
end

-- stream_full(key): whether `key` is a stream that can take no more entries.  Any writer may
-- add the largest id (18446744073709551615-18446744073709551615) explicitly; after it `XADD *`
-- fails, so half a move into that stream loses or repeats a job as a key of another type would.
local function stream_full(key)
  return stream_last_id(key) == '18446744073709551615-18446744073709551615'
end

-- wrong_type(script, {key, type, ...}): an error reply naming the first key that exists with
-- another type than the one given, or nil.  Type 'stream+' is a stream the script adds entries
-- to: one that is full (stream_full) is refused as well.
local function wrong_type(script, want)
  for j = 1, #want, 2 do
    local need = want[j + 1]
    local adds = need == 'stream+'
    if adds then
      need = 'stream'
    end
    local t = redis.call('TYPE', want[j]).ok
    if t ~= need and t ~= 'none' then
      return redis.error_reply(script .. ': ' .. want[j] .. ' is a ' .. t .. ', not a ' .. need)
    end
    if adds and t == 'stream' and stream_full(want[j]) then
      return redis.error_reply(script .. ': ' .. want[j] .. ' is full (its last id is the largest ' ..
        'a stream can hold, so XADD cannot add to it); nothing was written')
    end
  end
  return nil
end

-- events_max_for(key, max): `max`, or 0 when the events key is of another type: events are
-- best effort, so a spoiled events stream turns them off rather than failing the script after
-- its first write.
local function events_max_for(key, max)
  if max > 0 then
    local t = redis.call('TYPE', key).ok
    if t ~= 'stream' and t ~= 'none' then
      return 0
    end
  end
  return max
end
