from django.contrib import admin

from .models import Beat, Ping


@admin.register(Beat)
class BeatAdmin(admin.ModelAdmin):
    list_display = ["occurrence", "ran_at"]
    date_hierarchy = "occurrence"


@admin.register(Ping)
class PingAdmin(admin.ModelAdmin):
    list_display = ["label", "created_at"]
    search_fields = ["label"]
