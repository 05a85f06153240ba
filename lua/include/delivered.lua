-- delivered: where a stream's waiting entries begin (`--#include delivered`; drain_stream and
-- remove_entries).  Entries past the newest last-delivered-id of the stream's groups were
-- never delivered; those at or below it are pending (running, or to be reclaimed) or, acked,
-- already deleted.
--
-- parse_id(id): an entry id's ms and seq as numbers, or nil for anything else.
local function parse_id(id)
  local p = string.find(id, '-', 1, true)
  if not p then return nil end
  return tonumber(string.sub(id, 1, p - 1)), tonumber(string.sub(id, p + 1))
end

-- newest_delivered(key): the ms, seq and id of the newest last-delivered-id among the stream's
-- groups; -1, -1, nil when it has none (every entry waits).
local function newest_delivered(key)
  local best_ms, best_seq, best = -1, -1, nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    for i = 1, #g - 1, 2 do
      if g[i] == 'last-delivered-id' then
        local ms, seq = parse_id(g[i + 1])
        if ms and seq and (ms > best_ms or (ms == best_ms and seq > best_seq)) then
          best_ms, best_seq, best = ms, seq, g[i + 1]
        end
      end
    end
  end
  return best_ms, best_seq, best
end
