"""Open OnDemand's startup file for cocaq's web app (its `application`, cocaq.web.wsgi).

Passenger loads this file from the app's folder (/var/www/ood/apps/sys/cocaq) in each user's own
per-user nginx, as that user, with the Python of the folder's `bin/python`: the site's cocaq
virtualenv. Nothing else is here, so an upgrade of cocaq in that virtualenv is all the app needs.
"""

from cocaq.web.wsgi import application

__all__ = ["application"]
