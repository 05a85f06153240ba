-- stream_last_id: a stream's last id (XINFO STREAM's last-generated-id: it stays when that
-- entry is deleted), without its entries' fields leaving Redis, and '' when there is no stream
-- (a missing key is no error here, as it is for XINFO).  An events follower whose position is
-- the largest id asks it to learn when the stream was made again or its last id lowered.
-- KEYS[1] = stream
-- Reply   = the id, or ''
--#include key_types
return stream_last_id(KEYS[1]) or ''
