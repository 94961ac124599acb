ALTER TABLE instances DROP COLUMN session_tag;
