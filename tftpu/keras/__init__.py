"""tftpu.keras"""
