-- Shared by the scripts that check a lease (prepended to them).
-- Whether `stored` (a lock key's or a slot's value: "<owner>:<fence>",
-- then " <label>" when the holder gave one) belongs to lease `lease`
-- ("<owner>:<fence>"). The label never takes part.
local function is_lease(stored, lease)
  return stored == lease or (stored and string.sub(stored, 1, #lease + 1) == lease .. ' ')
end
