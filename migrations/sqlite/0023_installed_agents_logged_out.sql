-- An installed agent an admin logged out (keep in step with ../postgres/0023_installed_agents_logged_out.sql):
-- its members do not authenticate, on any replica, whatever they were installed or configured
-- with, until an admin signs it in again (which sets `auth_method` and clears this).
ALTER TABLE installed_agents ADD COLUMN logged_out INTEGER NOT NULL DEFAULT 0;
