"""Plugins that connect agent gateways to loopfuse (one subpackage per gateway)."""
